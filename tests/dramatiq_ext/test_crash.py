"""RET-12: a worker that dies mid-message costs exactly one attempt, a HANDLER_PANIC entry.

On Redis and RabbitMQ a real worker *process* is killed with SIGKILL while it runs
the message; a replacement worker then receives the message again (RabbitMQ
redelivers the unacked delivery; the Redis broker re-pushes a dead worker's unacked
message unchanged once its heartbeat is older than ``heartbeat_timeout``, during
queue maintenance, which runs on every command here). On StubBroker, where there
is no process to kill, the redelivery is reproduced by sending a message whose
record already shows its attempt running.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dramatiq_ext import get_job_record
from ojs_adapters import JobRecord
from tests.brokers import AMQP_URL, REDIS_URL
from tests.dramatiq_ext.conftest import open_env
from tests.dramatiq_ext.harness import Env

ROOT = Path(__file__).resolve().parents[2]
POLICY = {"max_attempts": 3, "initial_interval": "PT0.1S", "jitter": False}


@pytest.fixture(params=["redis", "rabbitmq"])
def crash_env(request: pytest.FixtureRequest) -> Iterator[Env]:
    """A Redis env with a 1 s heartbeat timeout and maintenance on every command, or RabbitMQ."""
    options: dict[str, Any] = {}
    if request.param == "redis":
        options = {"heartbeat_timeout": 1000, "maintenance_chance": 1_000_000}
    yield from open_env(request, request.param, **options)


def wait_until(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.mark.slow
def test_ret12_sigkill_mid_message_consumes_exactly_one_attempt(
        crash_env: Env, tmp_path: Path) -> None:
    env = crash_env
    calls: list[int] = []

    def job(*_args: object) -> None:
        calls.append(1)

    actor = env.actor(job, retry_policy=POLICY)
    message = actor.send(7)
    started = tmp_path / "started"
    config = {"kind": env.kind, "namespace": env.namespace, "queue": env.queue,
              "actor": actor.actor_name, "signal": str(started), "policy": json.dumps(POLICY),
              "redis_url": REDIS_URL, "amqp_url": AMQP_URL}
    proc = subprocess.Popen([sys.executable, "-m", "tests.dramatiq_ext.crash_worker",
                             json.dumps(config)], cwd=ROOT)
    try:
        wait_until(started.exists, 30, "the worker process never started the message")
        record = env.record(message.message_id)
        assert record is not None and (record.state, record.attempt) == ("active", 1)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    env.start()
    final = env.wait_record(message.message_id, timeout=30)
    assert (final.state, final.attempt) == ("completed", 2)
    [lost] = final.errors
    assert (lost.attempt, lost.code, lost.type) == (1, "HANDLER_PANIC", "ojs.worker_lost")
    assert final.extra["countdowns"] == [0.1]
    assert calls == [1]  # attempt 2 ran once here; attempt 1 died with its process


def _seed_running(env: Env, message: Any, attempt: int = 1) -> None:
    """Write the record a worker writes as ``attempt`` starts, as if it then died."""
    record = JobRecord(id=message.message_id, type=message.actor_name, queue=env.queue,
                       max_attempts=3).started(attempt)
    env.ojs.store_for(env.broker).save(message.message_id, record.to_dict())


@pytest.mark.parametrize(("policy", "runs", "outcome"), [
    ({**POLICY, "max_attempts": 2}, 1, "completed"),
    ({**POLICY, "max_attempts": 1}, 0, "discarded"),
    ({**POLICY, "max_attempts": 1, "on_exhaustion": "dead_letter"}, 0, "dead_letter"),
])
def test_ret12_redelivery_of_a_running_attempt_follows_the_policy(
        stub_env: Env, policy: dict[str, Any], runs: int, outcome: str) -> None:
    calls: list[int] = []
    actor = stub_env.actor(lambda: calls.append(1), retry_policy=policy)
    message = actor.message()
    _seed_running(stub_env, message)
    stub_env.start()
    started = time.monotonic()
    stub_env.broker.enqueue(message)
    record = stub_env.wait_record(message.message_id)
    assert (record.outcome, len(calls)) == (outcome, runs)
    assert [(e.attempt, e.code) for e in record.errors] == [(1, "HANDLER_PANIC")]
    if runs:  # the retry waited for its delay instead of running at once
        assert record.attempt == 2
        assert time.monotonic() - started >= 0.1
    if outcome == "dead_letter":
        [dead] = stub_env.dead_letters(expect=1)
        assert dead.options["ojs"]["errors"][0]["code"] == "HANDLER_PANIC"


def test_a_new_attempt_is_not_mistaken_for_a_crash(stub_env: Env) -> None:
    """Only the *same* attempt arriving while recorded active counts as a lost worker."""
    calls: list[int] = []
    actor = stub_env.actor(lambda: calls.append(1), retry_policy=POLICY)
    message = actor.message_with_options(ojs={"attempt": 2, "errors": []})
    _seed_running(stub_env, message, attempt=1)
    stub_env.start()
    stub_env.broker.enqueue(message)
    record = stub_env.wait_record(message.message_id)
    assert (record.state, record.errors, calls) == ("completed", (), [1])
    assert get_job_record(message.message_id, broker=stub_env.broker) == record
