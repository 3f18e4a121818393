"""Issue 10 on real workers: two worker processes per framework on Redis, one run log.

Each framework gets two worker subprocesses on one queue (``celery_worker``,
``dramatiq_worker``); every attempt they run is logged in Redis (``jobs.Runs``), so
the test sees idempotency keys, attempt times and which process ran what:

- idempotency keys (R-6): a UUID v4 per job, or the sender's own, the same on every
  retry, in the dead letter and after a replay, and kept in the job record;
- ``max_duration`` (R-3): no retry starts after first attempt + 1 s;
- ``retry_after`` (R-5): the delay is at least what the handler asked; a
  ``retry_after`` beyond the remaining duration exhausts the job at once;
- a retry budget (R-7) shared by both processes through Redis: retries stay within
  20% of executions, the rest are suppressed; both processes counted in one window.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import redis

from ojs_adapters import JobRecord
from ojs_adapters.runtime.dlq import DeadLetterFilter
from tests.brokers import REDIS_URL, require
from tests.extensions.jobs import BUDGET_SHARE, CONFIG_ENV, Config, Runs

ROOT = Path(__file__).resolve().parents[2]
#: Worker processes per framework, all on one queue.
WORKERS = 2


@dataclass
class Setup:
    """Two running workers of one framework, and how the test process talks to them."""

    framework: str
    config: Config
    runs: Runs
    send: Callable[..., str]  # send(job, n, **options) -> job id
    record: Callable[[str], JobRecord | None]
    dead_letters: Callable[[], Any]  # a DeadLetters over the queue

    def runs_of(self, job_id: str) -> list[dict[str, Any]]:
        return sorted((r for r in self.runs.all() if r["id"] == job_id),
                      key=lambda r: r["at"])


def _celery(config: Config) -> tuple[list[str], Any]:
    from celery_ext import get_job_record
    from celery_ext.dlq import dead_letter_queue
    from tests.extensions.celery_worker import build_app

    app = build_app(config)

    def send(job: str, n: int, **options: Any) -> str:
        return str(app.tasks[f"{config.ns}.{job}"].apply_async((n,), **options).id)

    argv = [sys.executable, "-m", "celery", "-A", "tests.extensions.celery_worker", "worker",
            "-P", "threads", "-c", "2", "-Q", config.queue, "--without-gossip",
            "--without-mingle", "--without-heartbeat", "-l", "WARNING"]
    return argv, (send, lambda i: get_job_record(i, app=app),
                  lambda: dead_letter_queue(app, queues=[config.queue]))


def _dramatiq(config: Config) -> tuple[list[str], Any]:
    from dramatiq_ext import get_job_record
    from dramatiq_ext.dlq import dead_letter_queue
    from tests.extensions.dramatiq_worker import build_broker

    broker, actors = build_broker(config)

    def send(job: str, n: int, **options: Any) -> str:
        return str(actors[job].send_with_options(args=(n,), **options).message_id)

    argv = [sys.executable, "-m", "tests.extensions.dramatiq_worker"]
    return argv, (send, lambda i: get_job_record(i, broker=broker),
                  lambda: dead_letter_queue(broker, queues=[config.queue]))


@pytest.fixture(scope="module", params=["celery", "dramatiq"])
def workers(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[Setup]:
    require("Redis", "127.0.0.1", 6379)
    ns = f"ojs-ext-{uuid.uuid4().hex[:8]}"
    config = Config(redis_url=REDIS_URL, ns=ns, queue=f"{ns}-q", dependency=f"{ns}-payments")
    argv, (send, record, dead) = (_celery if request.param == "celery" else _dramatiq)(config)
    env = {**os.environ, CONFIG_ENV: config.to_json(),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    logs = tmp_path_factory.mktemp(f"workers-{request.param}")
    procs = []
    for i in range(WORKERS):
        extra = [f"w{i}"] if request.param == "dramatiq" else ["-n", f"w{i}-{ns}@%h"]
        with open(logs / f"w{i}.log", "wb") as out:
            procs.append(subprocess.Popen([*argv, *extra], cwd=ROOT, env=env, stdout=out,
                                          stderr=subprocess.STDOUT, start_new_session=True))
    runs = Runs(config)
    try:
        _until(lambda: len(runs.client.keys(f"{ns}:ready:*")) == WORKERS, timeout=60,
               what=f"{WORKERS} {request.param} workers to start (logs in {logs})")
        yield Setup(request.param, config, runs, send, record, dead)
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        for key in runs.client.scan_iter(match=f"{ns}*", count=500):
            runs.client.delete(key)
        for key in runs.client.scan_iter(match=f"ojs:budget:{config.dependency}:*", count=500):
            runs.client.delete(key)


def _until(check: Callable[[], Any], *, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _ended(s: Setup, job_id: str, timeout: float = 20) -> JobRecord:
    def ended() -> JobRecord | None:
        record = s.record(job_id)
        return record if record is not None and record.state in ("completed", "discarded") \
            else None
    return _until(ended, timeout=timeout, what=f"job {job_id} to end")  # type: ignore[no-any-return]


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def test_r6_idempotency_key_is_kept_across_retries_dead_letter_and_replay(workers: Setup) -> None:
    s = workers
    ids = [s.send("keyed", n) for n in range(4)]
    own = s.send("keyed", 99, idempotency_key="order-99")
    everything = [*ids, own]
    _until(lambda: s.dead_letters().list().total == len(everything), timeout=30,
           what="five dead letters")
    for job_id in everything:
        assert [r["attempt"] for r in s.runs_of(job_id)] == [1, 2]
    s.runs.heal()
    report = s.dead_letters().replay(DeadLetterFilter(queue=s.config.queue))
    assert sorted(report.replayed) == sorted(everything)
    records = {i: _ended(s, i) for i in everything}
    keys = {}
    for job_id in everything:
        runs = s.runs_of(job_id)
        assert [(r["attempt"], r["replays"]) for r in runs] == [(1, 0), (2, 0), (1, 1)]
        assert len({r["key"] for r in runs}) == 1, runs  # one key for the logical job
        keys[job_id] = runs[0]["key"]
        assert records[job_id].state == "completed"
        assert records[job_id].extra["idempotency_key"] == keys[job_id]
    assert keys[own] == "order-99"
    generated = [keys[i] for i in ids]
    assert len(set(generated)) == len(ids)
    assert all(uuid.UUID(k).version == 4 and str(uuid.UUID(k)) == k for k in generated)


def test_r3_no_retry_starts_after_max_duration(workers: Setup) -> None:
    s = workers
    job_id = s.send("lasting", 1)
    record = _ended(s, job_id)
    runs = s.runs_of(job_id)
    first = runs[0]["at"]
    assert record.outcome == "discarded" and record.extra["end_reason"] == "max_duration"
    assert 2 <= len(runs) < 10 and [r["attempt"] for r in runs] == list(range(1, len(runs) + 1))
    assert all(r["at"] <= first + 1.0 for r in runs), runs  # max_duration PT1S
    # it stopped because the next retry (0.4 s after the last failure) would start too late
    assert _epoch(record.errors[-1].occurred_at) + 0.4 > first + 1.0
    assert record.extra["countdowns"] == [0.4] * (len(runs) - 1)


def test_r5_retry_after_lengthens_the_delay_or_exhausts_at_once(workers: Setup) -> None:
    s = workers
    slow, overdue = s.send("throttled", 1), s.send("overdue", 2)
    record = _ended(s, slow)
    runs = s.runs_of(slow)
    assert [r["attempt"] for r in runs] == [1, 2] and record.outcome == "completed"
    assert record.extra["countdowns"] == [1.5]  # not the policy's 0.05 s
    gap = runs[1]["at"] - _epoch(record.errors[0].occurred_at)
    assert 1.5 <= gap < 1.5 + 3.0, gap
    late = _ended(s, overdue)
    assert [r["attempt"] for r in s.runs_of(overdue)] == [1]
    assert late.outcome == "discarded" and late.extra["end_reason"] == "max_duration"


def test_r7_budget_shared_by_two_worker_processes_suppresses_retries(workers: Setup) -> None:
    s = workers
    """40 successes then 30 jobs that always fail: retries stay within 20% of executions."""
    ok = [s.send("limited", n) for n in range(40)]
    for job_id in ok:
        _ended(s, job_id)
    failing = [s.send("limited", -1 - n) for n in range(30)]
    records = {i: _ended(s, i) for i in failing}
    runs = [r for r in s.runs.all() if r["job"] == "limited"]
    executions = len(runs)
    retries = sum(1 for r in runs if r["attempt"] == 2)
    suppressed = [i for i, r in records.items() if r.extra.get("end_reason") == "budget"]
    print(f"\n{s.framework}: {executions} executions, {retries} retries granted, "
          f"{len(suppressed)} suppressed, by pid {dict(Counter(r['pid'] for r in runs))}")
    assert len({r["pid"] for r in runs}) == WORKERS, "both worker processes ran jobs"
    # counted once, in one shared window: what the two processes ran is what Redis holds
    client = redis.Redis.from_url(s.config.redis_url)
    stored = {kind: sum(int(client.get(k) or 0) for k in client.scan_iter(
        match=f"ojs:budget:{s.config.dependency}:{kind}:*")) for kind in ("e", "r")}
    assert stored == {"e": executions, "r": retries}
    assert retries <= int(executions * BUDGET_SHARE)
    assert retries >= int(40 * BUDGET_SHARE)  # the 40 successes alone allowed 8
    assert len(suppressed) == 30 - retries > 0
    for job_id in suppressed:
        record = records[job_id]
        assert record.attempt == 1 and record.outcome == "discarded"
        assert record.errors[-1].type == "ConnectionError"
