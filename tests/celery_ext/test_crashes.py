"""Lost workers and hard time limits consume exactly one attempt (RET-12), on Redis and RabbitMQ.

These run a real prefork worker in a subprocess (``worker_app``): only there
can a pool process be killed, a hard time limit fire, or the whole worker be
SIGKILLed. memory:// cannot take part: its broker lives inside one process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from celery_ext import get_job_record
from tests.brokers import REDIS_URL
from tests.celery_ext.support import wait_for

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.broker, pytest.mark.slow]


@pytest.fixture(params=["redis", "amqp"])
def broker_url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue(f"{request.param}_url"))


class Crashes:
    """One test's worker subprocesses, client app and markers."""

    def __init__(self, broker_url: str) -> None:
        self.prefix = f"ojs-test-{uuid.uuid4().hex[:8]}"
        self.queue = f"{self.prefix}-crash"
        self.env = {**os.environ, "OJS_TEST_BROKER": broker_url, "OJS_TEST_BACKEND": REDIS_URL,
                    "OJS_TEST_PREFIX": self.prefix, "PYTHONPATH": str(ROOT)}
        self.redis = redis.Redis.from_url(REDIS_URL)
        self.client = Celery("ojs_crash", broker=broker_url, backend=REDIS_URL,
                             set_as_current=False)
        self.client.conf.update(
            broker_transport_options=({"global_keyprefix": self.prefix + ":"}
                                      if broker_url.startswith("redis") else {}),
            result_backend_transport_options={"global_keyprefix": self.prefix + ":"})
        self.logs: list[Path] = []

    @contextmanager
    def worker(self, concurrency: int = 1) -> Iterator[subprocess.Popen[bytes]]:
        log = Path(tempfile.mkstemp(prefix="ojs-celery-worker-", suffix=".log")[1])
        self.logs.append(log)
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "tests.celery_ext.worker_app", "worker",
                 "-P", "prefork", "-c", str(concurrency), "-Q", self.queue, "-l", "INFO",
                 "-n", f"{self.prefix}-{len(self.logs)}@%h", "--without-gossip",
                 "--without-mingle", "--without-heartbeat"],
                cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)
        try:
            wait_for(lambda: b"ready." in log.read_bytes() or proc.poll() is not None,
                     timeout=30)
            assert proc.poll() is None, log.read_text()
            assert b"ojs-adapters:" not in log.read_bytes()  # the settings check is happy
            yield proc
        finally:
            kill_group(proc)

    def send(self, task: str) -> tuple[Any, str]:
        marker = f"{self.prefix}:runs:{uuid.uuid4().hex[:6]}"
        return self.client.send_task(f"ojs_crash.{task}", (marker,), queue=self.queue), marker

    def runs(self, marker: str) -> list[dict[str, int]]:
        return [json.loads(r) for r in self.redis.lrange(marker, 0, -1)]

    def cleanup(self) -> None:
        with self.client.connection_for_write() as conn:
            channel = conn.default_channel
            for name in (self.queue, f"{self.queue}.dead_letter"):
                for delete in (channel.queue_delete, channel.exchange_delete):
                    try:
                        delete(name)
                    except Exception:
                        channel = conn.channel()
        for key in self.redis.scan_iter(match=f"{self.prefix}:*", count=500):
            self.redis.delete(key)
        if os.environ.get("OJS_TEST_SHOW_LOGS"):
            print(self.log_text())
        for log in self.logs:
            log.unlink(missing_ok=True)

    def log_text(self) -> str:
        return "\n".join(f"--- {log}\n{log.read_text()[-4000:]}" for log in self.logs
                         if log.exists())


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the worker and its pool processes (its own process group)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


@pytest.fixture
def crashes(broker_url: str) -> Iterator[Crashes]:
    harness = Crashes(broker_url)
    try:
        yield harness
    finally:
        harness.cleanup()  # OJS_TEST_SHOW_LOGS=1 prints the worker logs first


def _assert_one_attempt_consumed(crashes: Crashes, result: Any, marker: str, code: str) -> None:
    try:
        assert result.get(timeout=30, interval=0.05) == "ok"
    except BaseException:
        print(crashes.log_text())
        raise
    record = get_job_record(result.id, app=crashes.client)
    assert record is not None
    assert (record.state, record.attempt) == ("completed", 2)
    assert [(e.attempt, e.code) for e in record.errors] == [(1, code)]
    assert record.extra["countdowns"] == [0.2]  # the policy's delay for retry 1, no jitter
    runs = crashes.runs(marker)
    assert [r["attempt"] for r in runs] == [1, 2]  # the body ran once per attempt


def test_ret12_killed_pool_process_and_time_limits_consume_one_attempt(
        crashes: Crashes) -> None:
    """SIGKILL of the pool process (WorkerLostError) -> HANDLER_PANIC; a hard time limit ->
    HANDLER_TIMEOUT via the redelivery; a soft one -> HANDLER_TIMEOUT in the body. Each
    consumes attempt 1 and retries after the countdown."""
    with crashes.worker(concurrency=3):
        lost, lost_marker = crashes.send("hangs_first")
        limited, limited_marker = crashes.send("limited")
        soft, soft_marker = crashes.send("soft_limited")
        [first] = wait_for(lambda: crashes.runs(lost_marker), timeout=20)
        wait_for(lambda: (get_job_record(lost.id, app=crashes.client) or None) and
                 get_job_record(lost.id, app=crashes.client).state == "active")  # type: ignore[union-attr]
        os.kill(first["pid"], signal.SIGKILL)
        _assert_one_attempt_consumed(crashes, lost, lost_marker, "HANDLER_PANIC")
        _assert_one_attempt_consumed(crashes, limited, limited_marker, "HANDLER_TIMEOUT")
        entry = get_job_record(limited.id, app=crashes.client).errors[0]  # type: ignore[union-attr]
        assert "hard time limit" in entry.message
        _assert_one_attempt_consumed(crashes, soft, soft_marker, "HANDLER_TIMEOUT")
        entry = get_job_record(soft.id, app=crashes.client).errors[0]  # type: ignore[union-attr]
        assert entry.type.endswith(".SoftTimeLimitExceeded")


def test_self_retry_after_the_soft_time_limit_retries_once(crashes: Crashes) -> None:
    """``except SoftTimeLimitExceeded: raise self.retry(countdown=0.3)`` in a prefork
    worker: one entry for attempt 1, a timeout (HANDLER_TIMEOUT, as when the body lets the
    exception go) the handler asked to retry (RETRY), its countdown the floor; attempt 2
    runs once and completes; nothing crashes, nothing runs twice."""
    with crashes.worker(concurrency=1):
        soft, marker = crashes.send("soft_then_retry")
        try:
            assert soft.get(timeout=30, interval=0.05) == "ok"
        except BaseException:
            print(crashes.log_text())
            raise
    record = get_job_record(soft.id, app=crashes.client)
    assert record is not None
    assert (record.state, record.attempt) == ("completed", 2)
    [entry] = record.errors
    assert (entry.attempt, entry.code, entry.handler_code) == (1, "HANDLER_TIMEOUT", "RETRY")
    assert entry.type.endswith(".SoftTimeLimitExceeded")
    assert record.extra["countdowns"] == [0.3]
    assert [r["attempt"] for r in crashes.runs(marker)] == [1, 2]


def test_ret12_sigkilled_worker_consumes_exactly_one_attempt(crashes: Crashes) -> None:
    """The whole worker SIGKILLed mid-task: the broker redelivers the same message to a new
    worker, which records HANDLER_PANIC for attempt 1 and retries; the body runs twice."""
    with crashes.worker() as first_worker:
        result, marker = crashes.send("hangs_first")
        wait_for(lambda: crashes.runs(marker), timeout=20)
        wait_for(lambda: (get_job_record(result.id, app=crashes.client) or None) and
                 get_job_record(result.id, app=crashes.client).state == "active")  # type: ignore[union-attr]
        kill_group(first_worker)
    started = time.monotonic()
    with crashes.worker():
        _assert_one_attempt_consumed(crashes, result, marker, "HANDLER_PANIC")
    assert time.monotonic() - started < 30
