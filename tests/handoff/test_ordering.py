"""Issue 11: records are saved in order, a live attempt is not taken for a lost one, and a
RabbitMQ ack goes only to the channel its message came on.

- Ordered saves: a late write for an earlier attempt (the ``handed_off`` mark written
  after the successor already ran) never replaces the newer record, on every store
  (one atomic script, one round trip, on Redis).
- Leases: the same copy of an attempt delivered again while its first delivery is
  still at work waits for it and is dropped, instead of recording a lost worker; once
  the holder's lease lapses (it died), the attempt counts as lost, as before.
- ``_rabbitmq_acks``: an ack of a delivery received before a reconnect is not sent
  through the new consumer (it would ack the new channel's message of the same tag).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from dramatiq_ext._rabbitmq_acks import _RECEIVED_BY, _ChannelBound
from dramatiq_ext.stores import (
    MemoryRecordStore,
    RedisRecordStore,
    ResultsRecordStore,
    saves_in_order,
)
from ojs_adapters import ErrorEntry, JobRecord
from ojs_adapters.runtime.handoff import handed_off
from ojs_adapters.runtime.leases import lease
from tests.dramatiq_ext.conftest import open_env
from tests.dramatiq_ext.harness import Env

ENTRY = ErrorEntry(1, "HANDLER_ERROR", "ValueError", "x", "2026-02-15T10:30:00.000Z")


def _attempt_1_handed_off(job: str) -> JobRecord:
    """The late ``handed_off`` mark of attempt 1."""
    waiting = JobRecord(job, "t", "q", 3).started(1).failed(ENTRY, action="retry", delay=0.1)
    return handed_off(waiting)


def _attempt_2_completed(job: str) -> JobRecord:
    return _attempt_1_handed_off(job).started(2).completed()


@pytest.fixture(params=["memory", "redis", "results"])
def dramatiq_store(request: pytest.FixtureRequest) -> Iterator[Any]:
    """Each Dramatiq record store that keeps order (Redis ones in a namespace of their own)."""
    if request.param == "memory":
        yield MemoryRecordStore()
        return
    import redis

    url = request.getfixturevalue("redis_url")
    client, prefix = redis.Redis.from_url(url), f"ojs-test-{uuid.uuid4().hex[:10]}"
    try:
        if request.param == "redis":
            yield RedisRecordStore(client=client, prefix=prefix)
        else:
            from dramatiq.results.backends import RedisBackend

            yield ResultsRecordStore(RedisBackend(url=url, namespace=prefix,
                                                  use_namespace_prefix_keys=True))
    finally:
        keys = list(client.scan_iter(match=f"{prefix}*", count=500))
        if keys:
            client.delete(*keys)


def test_a_save_for_an_earlier_attempt_keeps_the_newer_record(dramatiq_store: Any) -> None:
    store, job = dramatiq_store, str(uuid.uuid4())
    assert saves_in_order(store)
    store.save(job, _attempt_2_completed(job).to_dict())
    store.save(job, _attempt_1_handed_off(job).to_dict())  # the late mark
    kept = JobRecord.from_dict(store.load(job))
    assert (kept.state, kept.attempt) == ("completed", 2)
    replayed = JobRecord(job, "t", "q", 3, state="retryable", attempt=0,
                         extra={"replay_count": 1})
    store.save(job, replayed.to_dict())  # a replay starts a later round at attempt 0
    store.save(job, _attempt_2_completed(job).to_dict())  # a late write of the old round
    kept = JobRecord.from_dict(store.load(job))
    assert (kept.attempt, kept.extra["replay_count"]) == (0, 1)
    store.save(job, replayed.started(1).to_dict())  # the same rank or higher: written
    assert JobRecord.from_dict(store.load(job)).state == "active"


def _replacement_reset(job: str, attempt_before: int) -> JobRecord:
    """The record ``Task.replace`` leaves before the replacement is sent (``_replace``)."""
    return JobRecord(job, "t", "q", 3, attempt=0,
                     extra={"replaced_task_nesting": 1, "replaced_by": f"t{attempt_before}"})


def test_a_late_write_of_the_replaced_task_keeps_the_replacement_round(
        dramatiq_store: Any) -> None:
    """A replacement (``Task.replace``) is a later round than every attempt of the task it
    replaced: the replaced task's late ``handed_off`` mark (attempt 1) or a later attempt's
    write does not replace its record, whatever its attempt number."""
    store, job = dramatiq_store, str(uuid.uuid4())
    store.save(job, _replacement_reset(job, 2).to_dict())
    store.save(job, _attempt_1_handed_off(job).to_dict())  # late, from the replaced task
    store.save(job, _attempt_2_completed(job).to_dict())
    kept = JobRecord.from_dict(store.load(job))
    assert (kept.attempt, kept.extra["replaced_task_nesting"]) == (0, 1)
    store.save(job, _replacement_reset(job, 2).started(1).to_dict())  # its attempt 1
    assert JobRecord.from_dict(store.load(job)).state == "active"


@pytest.mark.broker
def test_admission_writes_over_an_earlier_round_at_a_higher_attempt(redis_url: str) -> None:
    """The admission script ranks as the ordered save does: the replacement's attempt 1
    starts over the replaced task's attempt 3, and the replaced task's attempt 3 (a
    redelivery) starts over nothing of the replacement's."""
    import redis

    from ojs_adapters.runtime.claims import begin_on_redis

    client, prefix = redis.Redis.from_url(redis_url), f"ojs-test-{uuid.uuid4().hex[:10]}"
    replaced = JobRecord("j", "t", "q", 3).started(3)
    replacement = JobRecord("j", "t", "q", 3, extra={"replaced_task_nesting": 1}).started(1)
    keys = {"record_key": f"{prefix}:record"}
    try:
        client.set(keys["record_key"], replaced.to_json())
        new_round = begin_on_redis(client, **keys, claim_key=f"{prefix}:c1", token="a|1",
                                   claim_ttl_ms=10_000, started=replacement.to_json(),
                                   record_ttl_ms=10_000, attempt=1, rounds=(1, 0))
        old_round = begin_on_redis(client, **keys, claim_key=f"{prefix}:c3", token="b|1",
                                   claim_ttl_ms=10_000, started=replaced.started(3).to_json(),
                                   record_ttl_ms=10_000, attempt=3, rounds=(0, 0))
        stored = JobRecord.from_dict(json.loads(client.get(keys["record_key"])))
    finally:
        client.delete(keys["record_key"], f"{prefix}:c1", f"{prefix}:c3")
    assert (new_round.claim, new_round.wrote) == ("new", True)
    assert (old_round.claim, old_round.wrote) == ("new", False)
    assert (stored.attempt, stored.extra["replaced_task_nesting"]) == (1, 1)


@pytest.mark.broker
def test_the_redis_ordered_save_is_one_round_trip(
        redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import redis
    from redis.connection import AbstractConnection

    client, prefix = redis.Redis.from_url(redis_url), f"ojs-test-{uuid.uuid4().hex[:10]}"
    store, job = RedisRecordStore(client=client, prefix=prefix), str(uuid.uuid4())
    store.save(job, _attempt_2_completed(job).to_dict())  # loads the script once
    sent: list[bytes] = []
    real = AbstractConnection.send_packed_command

    def counting(self: Any, command: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(command if isinstance(command, bytes) else b"".join(command))
        return real(self, command, *args, **kwargs)

    # Counted where a request is written, whichever path wrote it (``redis_wire``).
    monkeypatch.setattr(AbstractConnection, "send_packed_command", counting)
    try:
        store.save(job, _attempt_1_handed_off(job).to_dict())
    finally:
        monkeypatch.undo()
        client.delete(f"{prefix}:{job}")
    assert len(sent) == 1 and sent[0].count(b"EVALSHA") == 1, sent


@pytest.mark.broker
def test_celery_records_keep_order_on_redis_and_a_restore_forces(redis_url: str) -> None:
    from celery import Celery

    from celery_ext.records import RecordStore

    app = Celery("ojs-order", backend=redis_url)
    store, job = RecordStore(app.backend), str(uuid.uuid4())
    try:
        store.save(_attempt_2_completed(job))
        store.save(_attempt_1_handed_off(job))  # the late mark after Task.retry's publish
        kept = store.load(job)
        assert kept is not None and (kept.state, kept.attempt) == ("completed", 2)
        store.save(_attempt_1_handed_off(job), force=True)  # ``restore``: put it back
        kept = store.load(job)
        assert kept is not None and (kept.state, kept.attempt) == ("retryable", 1)
        store.save(_replacement_reset(job, 1), force=True)  # ``Task.replace``'s reset
        store.save(_attempt_2_completed(job))  # a late write of the replaced task
        kept = store.load(job)
        assert kept is not None and (kept.attempt, kept.extra["replaced_by"]) == (0, "t1")
    finally:
        store.delete(job)


@pytest.mark.broker
def test_a_begin_retried_after_a_lost_reply_still_starts_the_attempt(redis_url: str) -> None:
    """Its first call claimed and wrote ``active``; the retry must not read that as a crash."""
    import redis

    from ojs_adapters.runtime.claims import begin_on_redis

    client, prefix = redis.Redis.from_url(redis_url), f"ojs-test-{uuid.uuid4().hex[:10]}"
    started = JobRecord("j", "t", "q", 3).started(1).to_json()
    keys = {"claim_key": f"{prefix}:claim", "record_key": f"{prefix}:record"}
    try:
        calls = [begin_on_redis(client, **keys, token="sent|d1", claim_ttl_ms=10_000,
                                started=started, record_ttl_ms=10_000) for _ in range(2)]
        other = begin_on_redis(client, **keys, token="sent|d2", claim_ttl_ms=10_000,
                               started=started, record_ttl_ms=10_000)
    finally:
        client.delete(*keys.values())
    assert [tuple(c) for c in calls] == [("new", None, True, None, None)] * 2
    assert (other.claim, other.wrote) == ("mine", False)  # another delivery: a crash, maybe


def test_admission_takes_the_lease_in_the_same_call(redis_url: str) -> None:
    """Lease + claim + record + ``active`` in one script: a retried call (lost reply) still
    starts the attempt; another live delivery's lease stops a second one before its claim."""
    import redis

    from ojs_adapters.runtime.claims import begin_on_redis

    client, prefix = redis.Redis.from_url(redis_url), f"ojs-test-{uuid.uuid4().hex[:10]}"
    started = JobRecord("j", "t", "q", 3).started(1).to_json()
    keys = {"claim_key": f"{prefix}:claim", "record_key": f"{prefix}:record",
            "lease_key": f"{prefix}:lease"}
    try:
        calls = [begin_on_redis(client, **keys, token="sent|d1", claim_ttl_ms=10_000,
                                started=started, record_ttl_ms=10_000, lease_ttl_ms=6_000)
                 for _ in range(2)]
        other = begin_on_redis(client, **keys, token="sent|d2", claim_ttl_ms=10_000,
                               started=started, record_ttl_ms=10_000, lease_ttl_ms=6_000)
        claim_after = client.get(keys["claim_key"])
        lease_ttl = client.pttl(keys["lease_key"])
    finally:
        client.delete(*keys.values())
    assert [tuple(c) for c in calls] == [("new", None, True, True, None)] * 2
    assert (other.leased, other.wrote, other.record) == (False, False, None)
    assert claim_after == b"sent|d1"  # the waiting delivery claimed nothing
    assert 0 < lease_ttl <= 6_000


# -- leases -------------------------------------------------------------------------------


@pytest.fixture
def stub_env(request: pytest.FixtureRequest) -> Iterator[Env]:
    yield from open_env(request, "stub")


def _blocking_actor(env: Env, gate: threading.Event, runs: list[int]) -> Any:
    def job() -> None:
        runs.append(1)
        assert gate.wait(10), "never released"

    return env.actor(job, retry_policy={"max_attempts": 3, "initial_interval": "PT0.1S"})


def _wait(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_the_same_copy_delivered_while_its_attempt_runs_waits_and_is_dropped(
        stub_env: Env) -> None:
    """A redelivery of a running attempt (same copy, record ``active``) is no lost worker."""
    gate, runs = threading.Event(), []
    actor = _blocking_actor(stub_env, gate, runs)
    stub_env.start(threads=2)
    message = actor.send()
    _wait(lambda: runs == [1], "the first delivery to start")
    stub_env.broker.enqueue(message)  # the same copy again, as a broker redelivers it
    time.sleep(1.0)  # the second delivery meets the first one's live lease and waits
    gate.set()
    stub_env.broker.join(stub_env.queue, timeout=10_000)
    record = stub_env.wait_record(message.message_id)
    assert (record.state, record.attempt, record.errors, runs) == ("completed", 1, (), [1])


def test_a_lapsed_lease_lets_the_redelivery_count_the_attempt_lost(stub_env: Env) -> None:
    """The holder died: once its lease lapses, the redelivery records HANDLER_PANIC (RET-12)."""
    runs: list[int] = []
    actor = stub_env.actor(lambda: runs.append(1), retry_policy={
        "max_attempts": 3, "initial_interval": "PT0.1S"})
    message = actor.message()
    store = stub_env.ojs.store_for(stub_env.broker)
    store.save(message.message_id, JobRecord(message.message_id, actor.actor_name,
                                             stub_env.queue, 3).started(1).to_dict())
    assert lease(store, f"{message.message_id}:1", "sent|dead-worker", 700)
    stub_env.start()
    started = time.monotonic()
    stub_env.broker.enqueue(message)
    record = stub_env.wait_record(message.message_id)
    assert time.monotonic() - started >= 0.6  # it waited for the lease to lapse
    assert [(e.attempt, e.code) for e in record.errors] == [(1, "HANDLER_PANIC")]
    assert (record.state, record.attempt, runs) == ("completed", 2, [1])


class _ReadOutage(MemoryRecordStore):
    """A memory store whose record reads fail while ``down`` (a store out of reach for a
    moment); claims, leases and writes go through."""

    down = False

    def load(self, message_id: str) -> dict[str, Any] | None:
        if self.down:
            raise ConnectionError("store down")
        return super().load(message_id)


def test_a_redelivery_that_cannot_read_the_record_waits_for_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The same copy comes back after its attempt completed (its ack was lost), once the
    holder's lease has lapsed, while the record cannot be read for a moment: it waits for
    the record and is dropped as a duplicate. Judged on "no record" with its own claim
    ("mine"), it would count its finished attempt lost (a phantom HANDLER_PANIC, the job run
    again; the issue-11 hand-off test dead-lettered a completed job that way)."""
    from dramatiq_ext import OjsRetries
    from ojs_adapters.runtime import leases
    from ojs_adapters.runtime.backend_retry import BackendRetry
    from tests.dramatiq_ext.harness import make_env

    monkeypatch.setattr(leases, "LEASE_SECONDS", 0.3)
    store, runs = _ReadOutage(), []
    ojs = OjsRetries(store=store, jitter_source=lambda: 0.5,
                     backend_retry=BackendRetry(sleep=lambda s: None))
    with make_env("stub", ojs=ojs) as env:
        actor = env.actor(lambda: runs.append(1), retry_policy={
            "max_attempts": 3, "initial_interval": "PT0.1S"})
        env.start()
        message = actor.send()
        env.wait_record(message.message_id)
        time.sleep(0.6)  # the first delivery's lease lapses
        store.down = True
        restore = threading.Timer(1.5, lambda: setattr(store, "down", False))
        restore.start()
        env.broker.enqueue(message)  # the same copy again, as a broker redelivers it
        restore.join()
        env.broker.join(env.queue, timeout=10_000)
        time.sleep(0.5)  # a phantom retry, were there one, would run now
        record = env.wait_record(message.message_id)
    assert (record.state, record.attempt, record.errors, runs) == ("completed", 1, (), [1])


# -- RabbitMQ acks ------------------------------------------------------------------------


class _Consumer:
    """Stands for a ``_RabbitmqConsumer``: notes what it would send."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, Any]] = []

    def ack(self, message: Any) -> None:
        self.sent.append(("ack", message))

    def nack(self, message: Any) -> None:
        self.sent.append(("nack", message))


class _Delivery:
    message_id = "m1"


def test_an_ack_goes_only_to_the_consumer_that_received_the_message() -> None:
    before, after = _Consumer(), _Consumer()
    stale, fresh = _Delivery(), _Delivery()
    vars(stale)[_RECEIVED_BY] = before  # received before the connection was replaced
    vars(fresh)[_RECEIVED_BY] = after
    current = _ChannelBound(after)  # type: ignore[arg-type]
    current.ack(stale)  # type: ignore[arg-type]
    current.nack(stale)  # type: ignore[arg-type]
    current.ack(fresh)  # type: ignore[arg-type]
    assert (before.sent, after.sent) == ([], [("ack", fresh)])
