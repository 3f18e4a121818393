"""RET-11 on Dramatiq (issue 8): a long retry waits on the broker, not in a worker.

Real Redis and RabbitMQ, an in-process ``dramatiq.Worker``, ``OjsRetries(park_after=1)``:
``JOBS`` messages fail attempt 1 and wait ``DELAY`` s for attempt 2. While they wait,
every retry is on the broker (the Redis parked set, the RabbitMQ delay levels) and the
worker's delay queues hold none; then each attempt 2 runs exactly once, never before its
countdown. Each test uses delay levels of its own (``park_prefix``), removed afterwards.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from dramatiq.brokers.redis import RedisBroker
from dramatiq.message import Message

from dramatiq_ext import OjsRetries, current_job
from dramatiq_ext._parking import Mover, Parking, parked_key
from ojs_adapters.runtime.delay_levels import DelayLevels
from tests.dramatiq_ext.conftest import open_env
from tests.dramatiq_ext.harness import Env

pytestmark = [pytest.mark.broker, pytest.mark.slow]
#: Jobs per test.
JOBS = 12
#: The retry delay, seconds: over the 1 s parking threshold.
DELAY = 4.0
POLICY = {"max_attempts": 3, "initial_interval": "PT4S", "max_interval": "PT4S",
          "jitter": False}
#: Loose upper bound on how late attempt 2 may start (slow shared CI machines).
LATE = 4.0


class Runs:
    """Every attempt the actor ran: (message id, attempt, POSIX start time)."""

    def __init__(self) -> None:
        self.items: list[tuple[str, int, float]] = []
        self._lock = threading.Lock()

    def job(self) -> None:
        context = current_job()
        assert context is not None
        with self._lock:
            self.items.append((context.job_id, context.attempt, time.time()))
        if context.attempt == 1:
            raise ValueError("attempt 1 fails")

    def attempts(self, message_id: str) -> Counter[int]:
        with self._lock:
            return Counter(a for m, a, _ in self.items if m == message_id)

    def starts(self, message_id: str) -> list[float]:
        with self._lock:
            return sorted(t for m, _, t in self.items if m == message_id)


@pytest.fixture(params=["redis", "rabbitmq"])
def parked_env(request: pytest.FixtureRequest) -> Iterator[Env]:
    prefix = f"ojs_test_{uuid.uuid4().hex[:8]}"
    ojs = OjsRetries(jitter_source=lambda: 0.5, park_after=1, park_prefix=prefix)
    env_iter = open_env(request, request.param, ojs=ojs)
    env = next(env_iter)
    try:
        yield env
    finally:
        if env.kind == "rabbitmq":
            _delete_levels(env, ojs.parking.levels)
        next(env_iter, None)


def _amqp_channel(env: Env) -> Any:
    import pika

    return pika.BlockingConnection(env.broker.parameters).channel()


def _delete_levels(env: Env, levels: DelayLevels) -> None:
    channel = _amqp_channel(env)
    try:
        topology = levels.topology()
        for queue in topology.queues:
            channel.queue_delete(queue.name)
        for exchange in topology.exchanges:
            channel.exchange_delete(exchange)
    finally:
        channel.connection.close()


def parked(env: Env) -> int:
    """How many messages wait on the broker: the parked set, or the delay levels."""
    if env.kind == "redis":
        return int(env.redis.zcard(parked_key(env.broker)))
    channel = _amqp_channel(env)
    try:
        return sum(channel.queue_declare(queue.name, passive=True).method.message_count
                   for queue in env.ojs.parking.levels.topology().queues)
    finally:
        channel.connection.close()


def held(env: Env) -> int:
    """How many delayed messages the env's workers hold in memory."""
    return sum(consumer.delay_queue.qsize() for worker in env.workers
               for consumer in worker.consumers.values())


def wait_until(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _send_and_wait_for_failures(env: Env, runs: Runs) -> list[str]:
    actor = env.actor(runs.job, retry_policy=POLICY)
    ids = [actor.send().message_id for _ in range(JOBS)]
    wait_until(lambda: all(runs.attempts(m)[1] == 1 for m in ids), 20, "attempt 1 never ran")
    wait_until(lambda: all((r := env.record(m)) is not None and r.state == "retryable"
                           for m in ids), 10, "the retries were never decided")
    return ids


def _assert_each_retry_ran_once_on_time(env: Env, runs: Runs, ids: list[str]) -> None:
    for message_id in ids:
        record = env.wait_record(message_id, timeout=DELAY + 20)
        assert (record.state, record.attempt) == ("completed", 2), record
        assert record.extra["countdowns"] == [DELAY]  # the exact countdown, parked or not
    time.sleep(1.5)  # time for a second copy, were there one, to show up
    for message_id in ids:
        assert runs.attempts(message_id) == {1: 1, 2: 1}, runs.items
        first, second = runs.starts(message_id)
        assert DELAY <= second - first < DELAY + LATE  # never before the countdown (RET-11)
    assert parked(env) == 0


def test_ret11_long_retries_wait_on_the_broker_not_in_the_worker(parked_env: Env) -> None:
    env, runs = parked_env, Runs()
    env.start(threads=2)
    ids = _send_and_wait_for_failures(env, runs)
    assert parked(env) == JOBS  # every retry waits on the broker...
    assert held(env) == 0  # ...and none in the worker
    _assert_each_retry_ran_once_on_time(env, runs, ids)


def test_ret11_parked_retries_outlive_their_worker(parked_env: Env) -> None:
    env, runs = parked_env, Runs()
    first = env.start(threads=2)
    ids = _send_and_wait_for_failures(env, runs)
    first.stop(timeout=5000)
    env.workers.remove(first)
    assert parked(env) == JOBS
    time.sleep(DELAY)  # due while no worker runs: they wait on the broker
    env.start(threads=2)
    _assert_each_retry_ran_once_on_time(env, runs, ids)


def test_parked_entries_are_moved_once_by_racing_movers_as_enqueue_would(
        redis_url: str) -> None:
    namespace = f"ojs-test-{uuid.uuid4().hex[:10]}"
    broker = RedisBroker(url=redis_url, namespace=namespace)
    parking = Parking(park_after=1)
    queue = "park_race"
    originals = [Message(queue_name=queue, actor_name="job", args=(i,), kwargs={},
                         options={"ojs": {"attempt": 2}}) for i in range(300)]
    try:
        for message in originals:
            parking.park_redis(broker, message, 5_000)
        assert broker.client.zcard(parked_key(broker)) == 300
        movers = [Mover(broker) for _ in range(4)]
        counts: list[int] = []
        threads = [threading.Thread(target=lambda m=m: counts.append(m.move_due(time.time() + 10)))
                   for m in movers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sum(counts) == 300
        assert broker.client.zcard(parked_key(broker)) == 0
        ids = [i.decode() for i in broker.client.lrange(f"{namespace}:{queue}.DQ", 0, -1)]
        assert len(ids) == len(set(ids)) == 300
        datas = broker.client.hmget(f"{namespace}:{queue}.DQ.msgs", ids)
        moved = {m.message_id: m for m in (Message.decode(d) for d in datas)}
        for original in originals:
            copy = moved[original.message_id]
            assert copy.queue_name == f"{queue}.DQ"
            assert (copy.args, copy.options["ojs"]) == (original.args, {"attempt": 2})
            assert copy.options["redis_message_id"] in ids
            assert copy.options["eta"] > original.message_timestamp
    finally:
        keys = list(broker.client.scan_iter(match=f"{namespace}:*", count=500))
        if keys:
            broker.client.delete(*keys)
        broker.close()


def test_retries_parked_before_parking_was_turned_off_still_run(redis_url: str) -> None:
    from tests.dramatiq_ext.harness import make_env

    runs = Runs()
    ojs = OjsRetries(jitter_source=lambda: 0.5, park_after=None)
    with make_env("redis", redis_url=redis_url, ojs=ojs) as env:
        actor = env.actor(runs.job, retry_policy=POLICY)
        message = actor.message().copy(options={"ojs": {"attempt": 2}})
        Parking(park_after=1).park_redis(env.broker, message, 500)  # by an earlier worker
        env.start(threads=1)
        record = env.wait_record(message.message_id, timeout=10)
        assert (record.state, record.attempt) == ("completed", 2)
        assert runs.attempts(message.message_id) == {2: 1}
        assert parked(env) == 0
