"""RET-17: a dead letter whose FAILURE Celery cannot store (the result backend went away
during the attempt) still reaches its queue; Celery alone would ack the message and lose it.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker
from kombu import Connection

from celery_ext import HEADER, OjsTask
from tests.celery_ext.support import drain


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def doomed_redis(redis_url: str) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A Redis server of this test's own, which the test's job kills."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed")
    port = _free_port()
    server = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save",
                               "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                server.kill()
                raise
            time.sleep(0.05)
    try:
        yield server, port
    finally:
        server.kill()
        server.wait()


def test_a_dead_letter_whose_failure_cannot_be_stored_still_reaches_its_queue(
        amqp_url: str, doomed_redis: tuple[subprocess.Popen[bytes], int]) -> None:
    server, port = doomed_redis
    queue = f"ojs-test-internal-{uuid.uuid4().hex[:8]}"
    app = Celery(queue, broker=amqp_url, backend=f"redis://127.0.0.1:{port}/0",
                 set_as_current=False)
    app.conf.update(result_backend_transport_options={"retry_policy": {
        "max_retries": 1, "interval_start": 0, "interval_step": 0.1}},
        broker_connection_retry_on_startup=True, worker_hijack_root_logger=False)

    @app.task(base=OjsTask, bind=True, name=f"{queue}.job", shared=False,
              retry_policy={"max_attempts": 1, "on_exhaustion": "dead_letter"})
    def job(self: Any) -> None:
        server.kill()  # the result backend (and the records) go away mid-attempt
        server.wait()
        raise ValueError("boom")

    try:
        with start_worker(app, pool="threads", concurrency=1, perform_ping_check=False,
                          queues=[queue], loglevel="CRITICAL", shutdown_timeout=10):
            sent = job.apply_async(queue=queue)
            [letter] = drain(app, f"{queue}.dead_letter", timeout=30, expect=1)
        assert letter.headers["id"] == sent.id
        assert letter.headers["x-ojs-error-code"] == "HANDLER_ERROR"
        assert HEADER in letter.headers
    finally:
        with Connection(amqp_url) as conn:
            channel = conn.channel()
            for name in (queue, f"{queue}.dead_letter"):
                channel.queue_delete(name)
