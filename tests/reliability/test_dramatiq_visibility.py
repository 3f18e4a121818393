"""RET-13 and RET-11 on Dramatiq's Redis broker: a live worker's messages are never handed out
again, however long it holds them.

Dramatiq's Redis broker has no visibility timeout: each worker (broker instance)
refreshes its entry in ``__heartbeats__`` on every broker command, which its
consumer threads issue while they poll, whatever its actors are doing; queue
maintenance re-pushes only the unacked messages of a worker whose heartbeat is
older than ``heartbeat_timeout``. Two workers (two broker instances, one
namespace) run with a 2 s ``heartbeat_timeout`` and maintenance on every
command; a 6 s job and a retry waiting 5 s in a worker's in-memory delay queue
(its ``.DQ`` message unacked meanwhile) each run exactly once per attempt. The
``test_crash`` module shows the other side: a SIGKILLed worker's message comes back.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import dramatiq
import pytest
from dramatiq.middleware import CurrentMessage

from dramatiq_ext import OjsRetries
from dramatiq_ext._state import MessageState
from tests.dramatiq_ext.harness import TICK_MS, Env, build_broker, make_env

pytestmark = [pytest.mark.broker, pytest.mark.slow]
#: The brokers' heartbeat timeout, ms: a worker silent this long is dead.
HEARTBEAT_TIMEOUT_MS = 2000
BROKER_OPTIONS: dict[str, Any] = {"heartbeat_timeout": HEARTBEAT_TIMEOUT_MS,
                                  "maintenance_chance": 1_000_000}
#: After a job ended: time for a message handed out again to show up.
GRACE = 2.0


class Pair:
    """Two workers on two broker instances sharing one namespace and queue."""

    def __init__(self, env: Env, redis_url: str) -> None:
        self.env = env
        self.second, _client = build_broker("redis", env.namespace, redis_url=redis_url,
                                            **BROKER_OPTIONS)
        self.second.add_middleware(OjsRetries(jitter_source=lambda: 0.5))
        for broker in (env.broker, self.second):
            broker.add_middleware(CurrentMessage())
        self.runs: list[tuple[str, int, float]] = []  # (message id, attempt, started)
        self._lock = threading.Lock()
        self.workers: list[dramatiq.Worker] = []

    def actor(self, body: Callable[[int], Any], **options: Any) -> Any:
        """Declare the actor on both brokers, under one name; returns the first broker's."""
        name = f"{body.__name__}_{id(self)}"

        def job() -> Any:
            message = CurrentMessage.get_current_message()
            assert message is not None
            attempt = MessageState.of(message.options).attempt
            with self._lock:
                self.runs.append((message.message_id, attempt, time.time()))
            return body(attempt)

        job.__name__ = body.__name__
        dramatiq.actor(job, broker=self.second, queue_name=self.env.queue, actor_name=name,
                       **options)
        return dramatiq.actor(job, broker=self.env.broker, queue_name=self.env.queue,
                              actor_name=name, **options)

    def start(self) -> None:
        self.env.start(threads=1)
        worker = dramatiq.Worker(self.second, worker_timeout=TICK_MS, worker_threads=1)
        worker.start()
        self.workers.append(worker)

    def attempts(self, message_id: str) -> Counter[int]:
        with self._lock:
            return Counter(a for m, a, _ in self.runs if m == message_id)

    def close(self) -> None:
        for worker in self.workers:
            worker.stop(timeout=5000)
        self.second.close()


@pytest.fixture
def pair(redis_url: str) -> Iterator[Pair]:
    with make_env("redis", redis_url=redis_url, **BROKER_OPTIONS) as env:
        harness = Pair(env, redis_url)
        try:
            yield harness
        finally:
            harness.close()


def test_ret13_dramatiq_job_longer_than_the_heartbeat_timeout_runs_exactly_once(
        pair: Pair) -> None:
    def long_job(attempt: int) -> None:
        time.sleep(3 * HEARTBEAT_TIMEOUT_MS / 1000)

    actor = pair.actor(long_job, retry_policy={"max_attempts": 3, "initial_interval": "PT0.2S",
                                               "jitter": False})
    pair.start()
    message = actor.send()
    record = pair.env.wait_record(message.message_id, timeout=30)
    time.sleep(GRACE)
    assert pair.attempts(message.message_id) == {1: 1}, pair.runs
    record = pair.env.record(message.message_id) or record
    assert (record.state, record.attempt, record.errors) == ("completed", 1, ())


def test_ret11_dramatiq_retry_waiting_longer_than_the_heartbeat_timeout_runs_exactly_once(
        pair: Pair) -> None:
    def fails_once(attempt: int) -> None:
        if attempt == 1:
            raise ValueError("first attempt fails")

    actor = pair.actor(fails_once, retry_policy={"max_attempts": 3, "initial_interval": "PT5S",
                                                 "max_interval": "PT5S", "jitter": False})
    pair.start()
    message = actor.send()
    record = pair.env.wait_record(message.message_id, timeout=30)
    time.sleep(GRACE)
    assert pair.attempts(message.message_id) == {1: 1, 2: 1}, pair.runs
    starts = sorted(t for m, _, t in pair.runs if m == message.message_id)
    assert starts[1] - starts[0] >= 5.0
    record = pair.env.record(message.message_id) or record
    assert (record.state, record.attempt) == ("completed", 2)
    assert [(e.attempt, e.code) for e in record.errors] == [(1, "HANDLER_ERROR")]
