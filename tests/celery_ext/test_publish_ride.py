"""A retry's record and a dead letter's mark ride in the MULTI of the successor's push (Redis)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from celery import Celery
from kombu import Queue

from celery_ext import _publish_ride
from celery_ext.records import RecordStore
from ojs_adapters import JobRecord
from ojs_adapters.history import ErrorEntry
from ojs_adapters.runtime.handoff import HANDED_OFF, handed_off
from tests.celery_ext.conftest import Env
from tests.celery_ext.support import wait_for


@pytest.fixture
def app(redis_url: str) -> Iterator[Celery]:
    prefix = f"ojs-test-putride-{uuid.uuid4().hex[:8]}:"
    app = Celery("putride", broker=redis_url, backend=redis_url, set_as_current=False)
    app.conf.update(broker_transport_options={"global_keyprefix": prefix},
                    result_backend_transport_options={"global_keyprefix": prefix})
    yield app
    client = app.backend.client
    for key in client.scan_iter(match=f"{prefix}*"):
        client.delete(key)
    for key in client.scan_iter(match="celery-task-meta-putride-*"):
        client.delete(key)


def _push(app: Celery, queue: str) -> None:
    with app.producer_or_acquire() as producer:
        producer.publish({"n": 1}, exchange="", routing_key=queue,
                         declare=[Queue(queue, routing_key=queue)], retry=False)


def _retryable(task_id: str) -> JobRecord:
    entry = ErrorEntry(1, "HANDLER_ERROR", "ValueError", "boom", "2026-11-26T00:00:00Z")
    record = JobRecord(task_id, "t", "q", 3).started(1)
    return handed_off(record.failed(entry, action="retry", delay=1.0))


def _queued(app: Celery, queue: str) -> int:
    prefix = app.conf.broker_transport_options["global_keyprefix"]
    return int(app.backend.client.llen(prefix + queue))


def _no_save_alone(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    alone: list[str] = []
    real = RecordStore._redis_save

    def counted(self: Any, key: str, record: JobRecord, *args: Any) -> None:
        alone.append(record.id)
        real(self, key, record, *args)

    monkeypatch.setattr(RecordStore, "_redis_save", counted)
    return alone


@pytest.mark.broker
@pytest.mark.parametrize("first", [True, False], ids=["retry-record-first", "mark-after"])
def test_the_save_goes_in_the_transaction_of_the_push(app: Celery, first: bool,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    alone = _no_save_alone(monkeypatch)
    store, queue, task_id = RecordStore(app.backend), f"q-{uuid.uuid4().hex[:6]}", "putride-1"
    record = _retryable(task_id)
    assert store.save_with_publish(app, record, queue, first=first)
    _push(app, queue)
    assert _publish_ride.finish(), "the save did not ride"
    stored = store.load(task_id)
    assert stored is not None and stored.state == "retryable"
    assert stored.extra[HANDED_OFF] == f"{task_id}:2"
    assert _queued(app, queue) == 1
    assert alone == []


@pytest.mark.broker
def test_a_push_to_another_queue_comes_after_the_retry_s_record_unmarked(app: Celery) -> None:
    """A retry's record never follows a push: one the rider cannot ride saves it first,
    and unmarked (that push is not the successor's: if the successor's then failed, a mark
    would make its redelivered original a duplicate, and the job would be lost)."""
    store, queue = RecordStore(app.backend), f"q-{uuid.uuid4().hex[:6]}"
    marked = _retryable("putride-2")
    unmarked = replace(marked, extra={k: v for k, v in marked.extra.items() if k != HANDED_OFF})
    assert store.save_with_publish(app, marked, queue, first=True,
                                   alone=lambda: store.save(unmarked))
    _push(app, f"{queue}-other")
    assert not _publish_ride.finish()  # not ridden: the caller marks it after its push
    stored = store.load("putride-2")
    assert stored is not None and stored.state == "retryable"
    assert HANDED_OFF not in stored.extra
    assert _queued(app, f"{queue}-other") == 1


@pytest.mark.broker
def test_a_push_that_fails_keeps_the_save_for_its_next_try(
        app: Celery, monkeypatch: pytest.MonkeyPatch) -> None:
    """The transaction never reached Redis: the push tried again still carries the record."""
    import redis

    store, queue = RecordStore(app.backend), f"q-{uuid.uuid4().hex[:6]}"
    assert store.save_with_publish(app, _retryable("putride-4"), queue, first=True)
    real = redis.client.Pipeline.execute
    fails = [redis.ConnectionError("cut")]

    def flaky(self: Any, *args: Any, **kwargs: Any) -> Any:
        if fails:
            raise fails.pop()
        return real(self, *args, **kwargs)

    monkeypatch.setattr(redis.client.Pipeline, "execute", flaky)
    with pytest.raises(redis.ConnectionError):
        _push(app, queue)
    monkeypatch.setattr(redis.client.Pipeline, "execute", real)
    _push(app, queue)
    assert _publish_ride.finish()
    stored = store.load("putride-4")
    assert stored is not None and stored.state == "retryable"


@pytest.mark.broker
def test_records_in_another_database_never_ride(app: Celery, redis_url: str) -> None:
    other = Celery("putride", broker=redis_url, backend=redis_url.rsplit("/", 1)[0] + "/1",
                   set_as_current=False)
    store, queue = RecordStore(other.backend), f"q-{uuid.uuid4().hex[:6]}"
    assert not store.save_with_publish(app, _retryable("putride-3"), queue, first=True)
    _push(app, queue)
    assert not _publish_ride.finish()
    assert store.load("putride-3") is None
    assert _queued(app, queue) == 1


@pytest.mark.broker
def test_a_worker_writes_no_record_alone_on_retries_and_dead_letters(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """On Redis every record write of a retried or dead-lettered job rides: admission's
    script, the retry's push, Celery's result writes, the dead letter's push."""
    alone = _no_save_alone(monkeypatch)
    queue, scripted = env.take_queue(), env.tasks["scripted"]
    retried = scripted.apply_async((["raise:value", "ok"],), queue=queue)
    dead = scripted.apply_async((["raise:value"],), queue=queue,
                                retry_policy={"max_attempts": 2, "on_exhaustion": "dead_letter"})
    store = RecordStore(env.app.backend)

    def both_ended() -> list[JobRecord] | None:
        found = [store.load(retried.id), store.load(dead.id)]
        ended = [r for r in found if r is not None and (
            r.state == "completed" or (r.state == "discarded" and r.extra.get(HANDED_OFF)))]
        return ended if len(ended) == 2 else None

    done = wait_for(both_ended, timeout=20)
    assert [r.state for r in done] == ["completed", "discarded"]
    assert [e.attempt for e in done[1].errors] == [1, 2] and done[1].dead_lettered
    if env.name == "redis":
        assert alone == [], "a record was written in a round trip of its own"
    elif env.name == "amqp":  # publisher confirms: the retry's record goes first, alone
        assert retried.id in alone


@pytest.mark.broker
def test_a_worker_reads_no_result_meta_before_storing_an_outcome(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """Admission read each attempt's result meta; the SUCCESS, FAILURE and RETRY stores
    take it (``_result_ride.peek``). A RETRY's successor may have finished first: its store
    checks for that SUCCESS in the script that writes (``GUARDED_SET_LUA``), no read."""
    from celery_ext import _result_ride

    if env.name != "redis":
        pytest.skip("the peek is read with admission's script, on the Redis backend")
    queue, scripted = env.take_queue(), env.tasks["scripted"]
    scripted.apply_async((["ok"],), queue=queue).get(timeout=10)  # the worker is warm
    reads: list[Any] = []
    real = _result_ride._ORIGINAL_GET[0]
    monkeypatch.setattr(_result_ride, "_ORIGINAL_GET",
                        [lambda self, key: reads.append(key) or real(self, key)])
    done = scripted.apply_async((["ok"],), queue=queue)
    retried = scripted.apply_async((["raise:value", "ok"],), queue=queue)
    dead = scripted.apply_async((["raise:value"],), queue=queue,
                                retry_policy={"max_attempts": 1, "on_exhaustion": "dead_letter"})
    store = RecordStore(env.app.backend)
    wait_for(lambda: all((r := store.load(t.id)) is not None and r.state in (
        "completed", "discarded") for t in (done, retried, dead)), timeout=20)
    wait_for(lambda: env.app.backend.client.get(env.app.backend.get_key_for_task(dead.id)),
             timeout=10)
    metas = {env.app.backend.get_key_for_task(t.id): t for t in (done, retried, dead)}
    read = [metas[key] for key in reads if key in metas]
    assert read == [], "a store read the result meta from Redis"
    assert [env.app.backend.get_task_meta(t.id)["status"] for t in (done, retried)] == [
        "SUCCESS", "SUCCESS"], "a RETRY stored over its successor's SUCCESS"


def test_an_amqp_broker_is_never_asked_for_a_channel_to_know_it_shares_nothing(
        redis_url: str) -> None:
    """The check runs on a hand-off's path, when the broker may just have been cut: on
    AMQP it reads the transport's name only (port 1: any connection attempt fails)."""
    import redis
    from celery import Celery

    from celery_ext._publish_ride import shares_server

    app = Celery("unreachable", broker="amqp://guest:guest@127.0.0.1:1//",
                 set_as_current=False)
    app.conf.broker_connection_retry = False
    client = redis.Redis.from_url(redis_url)
    try:
        assert shares_server(app, client) is False
    finally:
        client.close()


@pytest.mark.broker
def test_a_dead_letter_push_refused_inside_exec_leaves_no_mark(
        env: Env, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Redis refuses a push inside EXEC (the dead-letter queue's key, declared before, now
    holds a string) and applies the mark that rode with it: the mark is taken back, so the
    redelivered original publishes its dead letter once the key is fixed. Before, it was
    dropped as a duplicate and the job was lost."""
    import kombu.messaging

    if env.name != "redis":
        pytest.skip("rides are Redis's")
    queue, scripted = env.take_queue(), env.tasks["scripted"]
    client, store = env.app.backend.client, RecordStore(env.app.backend)
    dead_key = f"{env.broker.prefix}:{queue}.dead_letter"
    policy = {"max_attempts": 1, "on_exhaustion": "dead_letter"}
    # As on a connection that declared the queue before the key changed type: kombu asks
    # a queue's length once per connection, and the worker's pool has several.
    monkeypatch.setattr(kombu.messaging, "maybe_declare", lambda *args, **kwargs: False)
    client.set(dead_key, "not a list")
    dead = scripted.apply_async((["raise:value"],), queue=queue, retry_policy=policy)
    # every try refused, the original requeued, and its redelivery judged
    wait_for(lambda: sum("requeueing" in r.getMessage() for r in caplog.records) >= 2,
             timeout=30)
    client.delete(dead_key)
    wait_for(lambda: client.type(dead_key) == b"list", timeout=20)
    assert client.llen(dead_key) == 1
    stored = store.load(dead.id)
    assert stored is not None and stored.extra.get(HANDED_OFF) and stored.dead_lettered


@pytest.mark.broker
@pytest.mark.parametrize("first", [True, False], ids=["retry-record-first", "mark-after"])
def test_a_push_refused_inside_exec_is_not_written_with_it(app: Celery, first: bool) -> None:
    """The save applied without the push: ``finish`` says it did not ride, so the caller
    puts the record back as it must be without a successor."""
    import redis

    store, queue = RecordStore(app.backend), f"q-{uuid.uuid4().hex[:6]}"
    prefix = app.conf.broker_transport_options["global_keyprefix"]
    _push(app, queue)  # declared (kombu asks the key's length once per connection)
    app.backend.client.delete(prefix + queue)
    app.backend.client.set(prefix + queue, "not a list")
    assert store.save_with_publish(app, _retryable("putride-7"), queue, first=first)
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        _push(app, queue)
    assert not _publish_ride.finish()
    assert store.load("putride-7") is not None  # it did apply: the caller must put it back


def test_sentinel_pools_never_ride() -> None:
    """Two Sentinel services show no host in their pools' settings: alike to a comparison
    of addresses, on different masters. A push must not ride on the backend's master."""
    from redis.sentinel import Sentinel

    sentinel = Sentinel([("127.0.0.1", 1)])
    broker, results = sentinel.master_for("broker"), sentinel.master_for("results")

    class Channel:
        pool = broker.connection_pool

    assert not _publish_ride._same_server(Channel(), results)
    assert not _publish_ride._same_server(Channel(), broker)
