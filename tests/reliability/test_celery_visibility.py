"""RET-13 and RET-11 on Celery's Redis transport: no delivery is handed out twice while held.

Kombu's Redis transport gives an unacked message back to its queue once it has
been unacked longer than ``visibility_timeout``, whether or not the worker that
holds it is alive. Two real prefork worker subprocesses (``celery_worker_app``)
consume one queue with a 2 s visibility timeout and a restore sweep every
second; the adapter's heartbeat (``celery_ext._heartbeat``) must keep

- a job that runs 6 s (three timeouts) from running a second time, and
- a retry whose 5 s countdown a worker holds in memory (an ETA message,
  unacked) from being handed to the other worker too,

so each (job id, attempt) runs exactly once; and when the worker holding a
waiting retry is SIGKILLed, its heartbeat stops with it and the other worker
gets the retry after the timeout and runs it, once. ``OJS_TEST_HEARTBEAT=0`` in the
environment runs the workers without the heartbeat: the first two tests then
fail (the control). ``OJS_TEST_SHOW_LOGS=1`` prints the worker logs.
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
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from celery_ext import get_job_record
from tests.brokers import REDIS_URL, require
from tests.celery_ext.support import wait_for

ROOT = Path(__file__).resolve().parents[2]
#: The workers' Redis visibility timeout, seconds.
VISIBILITY = 2.0
#: After a job ended: time for a copy handed out again to show up (restore sweep: 1 s).
GRACE = 2.0
pytestmark = [pytest.mark.broker, pytest.mark.slow]


class Workers:
    """Worker subprocesses on one fresh queue, and a client app sending to it."""

    def __init__(self, count: int) -> None:
        self.prefix = f"ojs-test-{uuid.uuid4().hex[:8]}"
        self.queue = f"{self.prefix}-vis"
        self.env = {**os.environ, "OJS_TEST_BROKER": REDIS_URL, "OJS_TEST_BACKEND": REDIS_URL,
                    "OJS_TEST_PREFIX": self.prefix, "OJS_TEST_VISIBILITY": str(VISIBILITY),
                    "PYTHONPATH": str(ROOT)}
        self.redis = redis.Redis.from_url(REDIS_URL)
        self.client = Celery("ojs_rel", broker=REDIS_URL, backend=REDIS_URL,
                             set_as_current=False)
        self.client.conf.update(
            broker_transport_options={"global_keyprefix": self.prefix + ":"},
            result_backend_transport_options={"global_keyprefix": self.prefix + ":"})
        self.logs = [Path(tempfile.mkstemp(prefix="ojs-vis-worker-", suffix=".log")[1])
                     for _ in range(count)]
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        """Start a worker in every slot whose worker is not running, and wait for them."""
        starting = []
        for i, log in enumerate(self.logs):
            if i < len(self.procs) and self.procs[i].poll() is None:
                continue
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "celery", "-A", "tests.reliability.celery_worker_app",
                     "worker", "-P", "prefork", "-c", "1", "-Q", self.queue, "-l", "INFO",
                     "-n", f"{self.prefix}-{i}-{uuid.uuid4().hex[:4]}@%h", "--without-gossip",
                     "--without-mingle", "--without-heartbeat"],
                    cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                    start_new_session=True)
            if i < len(self.procs):
                self.procs[i] = proc
            else:
                self.procs.append(proc)
            starting.append((proc, log))
        for proc, log in starting:
            wait_for(lambda: b"ready." in log.read_bytes() or proc.poll() is not None,  # noqa: B023
                     timeout=60)
            assert proc.poll() is None, log.read_text()
            if self.env.get("OJS_TEST_HEARTBEAT") != "0":  # the control run is warned
                assert b"ojs-adapters:" not in log.read_bytes()  # the settings check is happy

    def send(self, task: str, *args: Any) -> tuple[Any, str]:
        marker = f"{self.prefix}:runs:{uuid.uuid4().hex[:6]}"
        result = self.client.send_task(f"ojs_rel.{task}", (marker, *args), queue=self.queue)
        return result, marker

    def runs(self, marker: str) -> list[dict[str, Any]]:
        return [json.loads(r) for r in self.redis.lrange(marker, 0, -1)]

    def received(self, task_id: str) -> list[dict[str, Any]]:
        key = f"{self.prefix}:received:{task_id}"
        return [json.loads(r) for r in self.redis.lrange(key, 0, -1)]

    def kill(self, pid: int) -> None:
        """SIGKILL the worker whose main process is ``pid``, with its pool."""
        [proc] = [p for p in self.procs if p.pid == pid]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        for key in self.redis.scan_iter(match=f"{self.prefix}:*", count=500):
            self.redis.delete(key)
        if os.environ.get("OJS_TEST_SHOW_LOGS"):
            print(self.log_text())
        for log in self.logs:
            log.unlink(missing_ok=True)

    def log_text(self) -> str:
        return "\n".join(f"--- {log}\n{log.read_text()[-6000:]}" for log in self.logs
                         if log.exists())


@pytest.fixture(scope="module")
def pair() -> Iterator[Workers]:
    """Two single-process prefork workers on one queue (a redelivery finds an idle one)."""
    require("Redis", "127.0.0.1", 6379)  # skips (fails on CI) without Redis
    harness = Workers(2)
    try:
        yield harness
    finally:
        harness.stop()


@pytest.fixture
def workers(pair: Workers) -> Workers:
    """The pair, both running (a test that killed one left a slot to fill)."""
    pair.start()
    return pair


def _settle(workers: Workers, result: Any) -> None:
    try:
        assert result.get(timeout=30, interval=0.05) == "ok"
    except BaseException:
        print(workers.log_text())
        raise
    time.sleep(GRACE)  # a copy handed out again, were there one, runs now


def test_ret13_job_longer_than_the_visibility_timeout_runs_exactly_once(
        workers: Workers) -> None:
    """A 6 s job under a 2 s visibility timeout: one run, attempt 1, no lost attempt."""
    result, marker = workers.send("long_job", 3 * VISIBILITY)
    _settle(workers, result)
    runs = workers.runs(marker)
    assert Counter(r["attempt"] for r in runs) == {1: 1}, runs
    record = get_job_record(result.id, app=workers.client)
    assert record is not None
    assert (record.state, record.attempt, record.errors) == ("completed", 1, ())


def test_ret11_retry_waiting_longer_than_the_visibility_timeout_runs_exactly_once(
        workers: Workers) -> None:
    """Attempt 1 fails; the 5 s retry waits in a worker's memory, unacked, for over two
    visibility timeouts: attempt 2 runs once, and not before its delay (RET-11)."""
    result, marker = workers.send("fails_once")
    _settle(workers, result)
    runs = workers.runs(marker)
    assert Counter(r["attempt"] for r in runs) == {1: 1, 2: 1}, runs
    first, second = sorted(runs, key=lambda r: r["attempt"])
    assert second["at"] - first["at"] >= 5.0
    record = get_job_record(result.id, app=workers.client)
    assert record is not None
    assert (record.state, record.attempt) == ("completed", 2)
    assert [(e.attempt, e.code) for e in record.errors] == [(1, "HANDLER_ERROR")]


def test_ret12_retry_held_by_a_killed_worker_is_handed_out_again_and_runs_once(
        workers: Workers) -> None:
    """The worker holding the waiting retry is SIGKILLed: no heartbeat any more, so kombu
    restores the message after the timeout; the other worker runs attempt 2 once, on time
    (the attempt never started, so nothing is counted as lost)."""
    result, marker = workers.send("fails_once")
    [holder] = wait_for(lambda: [r for r in workers.received(result.id) if r["eta"]],
                        timeout=20)
    workers.kill(holder["worker"])
    _settle(workers, result)
    runs = workers.runs(marker)
    assert Counter(r["attempt"] for r in runs) == {1: 1, 2: 1}, runs
    first, second = sorted(runs, key=lambda r: r["attempt"])
    assert second["worker"] != holder["worker"]
    assert second["at"] - first["at"] >= 5.0
    record = get_job_record(result.id, app=workers.client)
    assert record is not None
    assert (record.state, record.attempt) == ("completed", 2)
    assert [(e.attempt, e.code) for e in record.errors] == [(1, "HANDLER_ERROR")]
