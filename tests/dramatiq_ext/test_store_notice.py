"""Issue 16: a worker whose record store turns guarantees off says so once, as it starts.

Real workers: a ``RabbitmqBroker`` without ``Results`` keeps job records in worker
memory (one warning naming what is off and the fix); with a Redis store, a Results
``RedisBackend`` or the Redis broker's own Redis, nothing is said.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.rabbitmq import RabbitmqBroker

from dramatiq_ext import OjsRetries, RedisRecordStore, get_job_record
from tests.dramatiq_ext.harness import TICK_MS, dramatiq_defaults, make_env, pika_url


def _notices(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("dramatiq_ext")
            and ("in this process only" in r.getMessage() or "are off" in r.getMessage())]


@contextmanager
def rabbitmq_without_results(amqp_url: str, ojs: OjsRetries) -> Iterator[tuple[Any, Any]]:
    """A RabbitMQ broker with Dramatiq's defaults and ``ojs``, no ``Results``; one actor."""
    queue = f"ojs_test_{uuid.uuid4().hex[:10]}"
    broker = RabbitmqBroker(url=pika_url(amqp_url), middleware=dramatiq_defaults())
    broker.add_middleware(ojs)
    actor = dramatiq.actor(lambda n: n, broker=broker, queue_name=queue, actor_name=queue)
    try:
        yield broker, actor
    finally:
        for name in (queue, f"{queue}.DQ", f"{queue}.XQ"):
            broker.channel.queue_delete(name)
        broker.close()


def _run(broker: Any, actor: Any, messages: int = 3) -> None:
    """Start a worker, run ``messages`` messages to completion, stop it."""
    worker = dramatiq.Worker(broker, worker_timeout=TICK_MS, worker_threads=2)
    worker.start()
    try:
        sent = [actor.send(n) for n in range(messages)]
        deadline = time.monotonic() + 15
        for message in sent:
            while (record := get_job_record(message.message_id, broker=broker)) is None \
                    or record.state != "completed":
                assert time.monotonic() < deadline, record
                time.sleep(0.02)
    finally:
        worker.stop(timeout=5000)


def test_rabbitmq_without_results_warns_once_at_worker_start(
        amqp_url: str, caplog: pytest.LogCaptureFixture) -> None:
    with rabbitmq_without_results(amqp_url, OjsRetries()) as (broker, actor), \
            caplog.at_level(logging.WARNING, logger="dramatiq_ext"):
        worker = dramatiq.Worker(broker, worker_timeout=TICK_MS, worker_threads=2)
        worker.start()  # said here, before any message
        try:
            [said] = _notices(caplog)
        finally:
            worker.stop(timeout=5000)
        _run(broker, actor)  # a second start and three messages: nothing more
    assert len(_notices(caplog)) == 1
    text = said.getMessage()
    assert said.levelno == logging.WARNING and "RabbitmqBroker" in text
    for off in ("MemoryRecordStore", "get_job_record", "worker-crash counting is off",
                "leases and claims"):
        assert off in text
    assert "RedisRecordStore" in text and "Results" in text  # the fix


def test_rabbitmq_with_a_redis_store_says_nothing(
        amqp_url: str, redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    prefix = f"ojs-test-{uuid.uuid4().hex[:10]}"
    store = RedisRecordStore(url=redis_url, prefix=prefix)
    try:
        with rabbitmq_without_results(amqp_url, OjsRetries(store=store)) as (broker, actor), \
                caplog.at_level(logging.WARNING, logger="dramatiq_ext"):
            _run(broker, actor)
    finally:
        keys = list(store.client.scan_iter(match=f"{prefix}:*"))
        if keys:
            store.client.delete(*keys)
    assert _notices(caplog) == []


@pytest.mark.parametrize("kind", ["redis", "rabbitmq"])
def test_default_stores_on_real_brokers_say_nothing(
        request: pytest.FixtureRequest, kind: str, caplog: pytest.LogCaptureFixture) -> None:
    """Redis: the broker's own Redis; RabbitMQ (harness): a Results RedisBackend."""
    urls = {"redis_url": request.getfixturevalue("redis_url")}
    if kind == "rabbitmq":
        urls["amqp_url"] = request.getfixturevalue("amqp_url")
    with make_env(kind, **urls) as env, \
            caplog.at_level(logging.WARNING, logger="dramatiq_ext"):
        actor = env.actor(lambda: None)
        env.start()
        env.wait_record(actor.send().message_id)
    assert _notices(caplog) == []


class LoadSaveStore:
    """A store with records only: no claims, no leases."""

    def load(self, message_id: str) -> dict[str, Any] | None:
        return None

    def save(self, message_id: str, record: Any) -> None:
        pass


def test_what_each_store_turns_off() -> None:
    from dramatiq.brokers.stub import StubBroker
    from dramatiq.results.backends import StubBackend

    from dramatiq_ext._notices import store_gaps
    from dramatiq_ext.stores import MemoryRecordStore, ResultsRecordStore

    real: Any = object.__new__(RabbitmqBroker)  # only its type is read
    assert store_gaps(StubBroker(), MemoryRecordStore()) == []
    assert len(store_gaps(real, MemoryRecordStore())) == 3
    assert len(store_gaps(real, ResultsRecordStore(StubBackend()))) == 3  # in-process backend
    assert [gap.split(" ")[0] for gap in store_gaps(real, LoadSaveStore())] == [
        "claims", "leases"]
