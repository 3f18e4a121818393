"""The metrics recipe of docs/operations/observability.md on Celery's default prefork pool.

``celery -A app worker -c 2`` decides in its pool's children; ``serve_metrics`` runs in the
main process (``worker_init``) and, with ``PROMETHEUS_MULTIPROC_DIR`` set to an empty
directory, serves what the children counted. Without it every ``ojs_`` series read zero.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from celery import Celery
from prometheus_client.parser import text_string_to_metric_families

from tests.celery_ext.support import stop_group, wait_for

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
JOBS = 4
pytestmark = pytest.mark.broker

APP = '''
from celery import Celery
from celery.signals import worker_init

from celery_ext import OjsTask
from ojs_adapters.runtime.metrics import enable_metrics, serve_metrics

app = Celery("app", broker="{url}", backend="{url}")
app.conf.update(task_default_queue="{queue}", broker_connection_retry_on_startup=True,
                broker_transport_options={{"global_keyprefix": "{prefix}:"}},
                result_backend_transport_options={{"global_keyprefix": "{prefix}:"}})
enable_metrics()


@worker_init.connect
def start_metrics_server(**_):
    serve_metrics({port}, "127.0.0.1")


@app.task(base=OjsTask, retry_policy={{"max_attempts": 3, "initial_interval": "PT0.1S",
                                       "jitter": False, "on_exhaustion": "dead_letter"}})
def flaky(n):
    raise ValueError("boom")
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _samples(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = httpx.get(url, timeout=5).text
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


@pytest.fixture
def prefix(redis_url: str) -> Iterator[str]:
    name = f"ojs-test-metrics-{uuid.uuid4().hex[:8]}"
    yield name
    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(f"{name}*"):
        client.delete(key)
    client.close()


def test_prefork_children_counts_are_served_by_the_main_process(
        tmp_path: Path, redis_url: str, prefix: str) -> None:
    port, queue, files = _free_port(), f"{prefix}-q", tmp_path / "prometheus"
    files.mkdir()
    (tmp_path / "app.py").write_text(APP.format(url=redis_url, queue=queue, prefix=prefix,
                                                port=port))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PROMETHEUS_MULTIPROC_DIR": str(files)}
    log = tmp_path / "worker.log"
    with log.open("w") as out:
        worker = subprocess.Popen(
            [str(BIN / "celery"), "-A", "app", "worker", "-c", "2", "--loglevel=WARNING"],
            cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True)
    client = Celery("client", broker=redis_url, set_as_current=False)
    client.conf.broker_transport_options = {"global_keyprefix": f"{prefix}:"}
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        for n in range(JOBS):
            client.send_task("app.flaky", (n,), queue=queue)
        dead = ("ojs_dead_letter_total", frozenset({("queue", queue)}))

        def served() -> dict[tuple[str, frozenset[tuple[str, str]]], float] | None:
            assert worker.poll() is None, f"the worker stopped:\n{log.read_text()}"
            try:
                samples = _samples(url)
            except httpx.HTTPError:
                return None
            return samples if samples.get(dead) == JOBS else None

        samples = wait_for(served, timeout=40, interval=0.3)
        task = ("task", "app.flaky")
        for attempt in ("2", "3"):
            key = frozenset({task, ("queue", queue), ("attempt", attempt)})
            assert samples[("ojs_retry_attempts_total", key)] == JOBS
        assert samples[("ojs_retry_exhausted_total", frozenset({task, ("queue", queue)}))] \
            == JOBS
        assert samples[("ojs_retry_backoff_seconds_count", frozenset())] == 2 * JOBS
        # Counted in the pool's children, served by the main process.
        counted = {int(p.stem.rpartition("_")[2]) for p in files.glob("counter_*.db")}
        assert counted and worker.pid not in counted
    finally:
        client.close()
        stop_group(worker)
