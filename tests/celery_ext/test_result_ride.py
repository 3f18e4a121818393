"""The last record save of an attempt rides in Celery's own result transaction (Redis)."""

from __future__ import annotations

import json
import sys
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, states

from celery_ext import _result_ride
from celery_ext.records import RecordStore
from ojs_adapters import JobRecord
from ojs_adapters.runtime.handoff import ORDERED_SAVE_LUA


@pytest.fixture
def backend(redis_url: str) -> Iterator[Any]:
    app = Celery(f"ride-{uuid.uuid4().hex[:8]}", broker="memory://", backend=redis_url)
    prefix = f"ojs-test-ride-{uuid.uuid4().hex[:8]}-"
    backend = app.backend
    backend.task_keyprefix = prefix.encode()
    yield backend
    client = backend.client
    for key in client.scan_iter(match=f"{prefix}*"):
        client.delete(key)


@pytest.fixture(autouse=True)
def _fresh_thread_state() -> Iterator[None]:
    """No peek, rider or guard a failed test left behind reaches the next one."""
    _result_ride.finish()
    yield
    _result_ride.finish()


def _ride(backend: Any, record: JobRecord, saved: list[str]) -> bool:
    return RecordStore(backend).save_with_result(record, None, lambda: saved.append("alone"))


def _reads(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The result meta reads that go to Redis from now on."""
    reads: list[Any] = []
    real = _result_ride._ORIGINAL_GET[0]
    monkeypatch.setattr(_result_ride, "_ORIGINAL_GET",
                        [lambda self, k: reads.append(k) or real(self, k)])
    return reads


def test_the_record_is_written_in_the_result_transaction(backend: Any) -> None:
    task_id, saved = uuid.uuid4().hex, []
    assert _ride(backend, JobRecord(task_id, "t", "q", 3).started(1).completed(), saved)
    backend.store_result(task_id, 42, states.SUCCESS)
    _result_ride.finish()
    record = RecordStore(backend).load(task_id)
    assert record is not None and record.state == "completed"
    assert backend.get_task_meta(task_id)["result"] == 42
    assert saved == []  # it rode: no save of its own


def test_a_result_write_of_another_task_leaves_the_rider_to_save_alone(backend: Any) -> None:
    task_id, saved = uuid.uuid4().hex, []
    assert _ride(backend, JobRecord(task_id, "t", "q", 3).started(1).completed(), saved)
    backend.store_result(uuid.uuid4().hex, 1, states.SUCCESS)
    assert RecordStore(backend).load(task_id) is None
    _result_ride.finish()  # task_postrun, when no result of this task was written
    assert saved == ["alone"]


def test_a_script_redis_lost_still_rides_with_the_result(backend: Any) -> None:
    """After a Redis restart or SCRIPT FLUSH the result is still never seen without its
    record (with EVALSHA the ride failed NOSCRIPT and the record came after)."""
    task_id, saved = uuid.uuid4().hex, []
    store = RecordStore(backend)
    record = JobRecord(task_id, "t", "q", 3).started(1).completed()
    fresh = f"-- {uuid.uuid4().hex}\n{ORDERED_SAVE_LUA}"  # a script Redis never saw
    key = backend.get_key_for_task(task_id, key=".ojs")
    keys, args = store._save_call(key, record, None)
    assert _result_ride.attach(backend, task_id, fresh, keys, args,
                               lambda: saved.append("alone"))
    backend.store_result(task_id, 7, states.SUCCESS)
    assert backend.get_task_meta(task_id)["result"] == 7
    loaded = store.load(task_id)
    assert loaded is not None and loaded.state == "completed"  # before finish(): it rode
    _result_ride.finish()
    assert saved == []


def test_a_save_redis_refuses_in_the_transaction_is_done_alone_after(
        backend: Any) -> None:
    task_id, saved = uuid.uuid4().hex, []
    store = RecordStore(backend)
    record = JobRecord(task_id, "t", "q", 3).started(1).completed()
    key = backend.get_key_for_task(task_id, key=".ojs")
    backend.client.rpush(key, "not a record")  # the save's script errors: WRONGTYPE
    keys, args = store._save_call(key, record, None)
    assert _result_ride.attach(backend, task_id, ORDERED_SAVE_LUA, keys, args,
                               lambda: saved.append("alone"))
    backend.store_result(task_id, 7, states.SUCCESS)  # Celery's own write still lands
    assert backend.get_task_meta(task_id)["result"] == 7
    _result_ride.finish()
    assert saved == ["alone"]


def test_other_backends_do_not_ride() -> None:
    app = Celery("ride-cache", broker="memory://", backend="cache+memory://")
    assert not RecordStore(app.backend).save_with_result(
        JobRecord("x", "t", "q", 3).started(1), None, lambda: None)


def test_an_armed_peek_answers_the_read_before_the_store_once(
        backend: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Admission read the result meta: Celery's read before storing SUCCESS takes it."""
    task_id = uuid.uuid4().hex
    key = _result_ride.meta_key(backend, task_id)
    assert key is not None
    backend.store_result(task_id, 1, states.STARTED)  # what admission saw
    _result_ride.peek(key, backend.client.get(key))
    _result_ride.arm_peek()
    reads = _reads(monkeypatch)
    backend.store_result(task_id, 42, states.SUCCESS)
    assert reads == [], "the store read the meta from Redis"
    assert backend.get_task_meta(task_id)["result"] == 42
    assert reads == [key], "a peek answers one read only"
    _result_ride.finish()


def test_a_read_of_the_meta_during_the_attempt_spoils_the_peek(
        backend: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The body stored SUCCESS itself (``update_state``): Celery's own check must see it."""
    task_id = uuid.uuid4().hex
    key = _result_ride.meta_key(backend, task_id)
    _result_ride.peek(key, None)
    backend.store_result(task_id, "mine", states.SUCCESS)  # reads the key: spoiled
    _result_ride.arm_peek()
    backend.store_result(task_id, "late", states.SUCCESS)  # Celery keeps the first SUCCESS
    assert backend.get_task_meta(task_id)["result"] == "mine"
    _result_ride.finish()


def _in_another_thread(work: Any) -> None:
    worker = threading.Thread(target=work)
    worker.start()
    worker.join()


def test_a_retry_store_takes_the_peek_and_writes_in_one_script(
        backend: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """RETRY is stored (and published, for ``AsyncResult`` listeners) with no read of its
    own; the record rides in the same transaction."""
    task_id, saved = uuid.uuid4().hex, []
    key = _result_ride.meta_key(backend, task_id)
    backend.store_result(task_id, 1, states.STARTED)
    _result_ride.peek(key, backend.client.get(key))
    assert _ride(backend, JobRecord(task_id, "t", "q", 3).started(1), saved)
    _result_ride.arm_peek()
    reads = _reads(monkeypatch)
    listener = backend.client.pubsub(ignore_subscribe_messages=True)
    listener.subscribe(key)
    backend.store_result(task_id, ValueError("again"), states.RETRY)
    assert reads == [], "the RETRY store read the meta from Redis"
    assert backend.get_task_meta(task_id)["status"] == states.RETRY
    assert 0 < backend.client.ttl(key) <= int(backend.expires), "written with its expiry"
    message = None
    for _ in range(5):  # the first read may be the subscription's confirmation
        message = message or listener.get_message(timeout=1)
    assert message is not None and backend.decode_result(message["data"])["status"] == \
        states.RETRY
    listener.close()
    record = RecordStore(backend).load(task_id)
    assert record is not None and record.state == "active"  # it rode
    _result_ride.finish()
    assert saved == []


@pytest.mark.parametrize("state", [states.RETRY, states.FAILURE, states.SUCCESS])
def test_a_store_that_took_the_peek_never_overwrites_a_success_since(
        backend: Any, monkeypatch: pytest.MonkeyPatch, state: str) -> None:
    """Celery's rule (never overwrite a SUCCESS) holds though the peek predates it: a
    retry's successor finished between admission and the RETRY store, or a delivery whose
    lease lapsed stored SUCCESS before this one's FAILURE (or SUCCESS)."""
    task_id, saved = uuid.uuid4().hex, []
    key = _result_ride.meta_key(backend, task_id)
    _result_ride.peek(key, None)
    _in_another_thread(lambda: backend.store_result(task_id, "done", states.SUCCESS))
    assert _ride(backend, JobRecord(task_id, "t", "q", 3).started(1), saved)
    _result_ride.arm_peek()
    reads = _reads(monkeypatch)
    outcome = "late" if state == states.SUCCESS else ValueError("again")
    backend.store_result(task_id, outcome, state)
    assert reads == []
    assert backend.get_task_meta(task_id)["result"] == "done"
    record = RecordStore(backend).load(task_id)
    assert record is not None and record.state == "active"  # the record still rode
    _result_ride.finish()
    assert saved == []


@pytest.mark.parametrize("stored", [states.SUCCESS, states.STARTED])
def test_a_meta_not_in_celerys_key_order_is_read_whole(
        backend: Any, monkeypatch: pytest.MonkeyPatch, stored: str) -> None:
    """The script reads ``status`` from the meta's prefix as Celery writes it, else from
    the decoded meta: either way a SUCCESS stays and nothing is read from Python."""
    task_id = uuid.uuid4().hex
    key = _result_ride.meta_key(backend, task_id)
    _result_ride.peek(key, None)
    backend.client.set(key, json.dumps({"result": "x", "status": stored}))
    _result_ride.arm_peek()
    reads = _reads(monkeypatch)
    backend.store_result(task_id, ValueError("again"), states.RETRY)
    assert reads == []
    expected = states.SUCCESS if stored == states.SUCCESS else states.RETRY
    assert backend.get_task_meta(task_id)["status"] == expected


@pytest.mark.parametrize("stored", [states.SUCCESS, states.STARTED])
def test_a_meta_lua_cannot_read_leaves_the_rule_to_celery(
        backend: Any, monkeypatch: pytest.MonkeyPatch, stored: str) -> None:
    """A meta nested deeper than Lua's JSON reads (Python reads it here): the script
    writes nothing and Celery's read and rule decide, as without the peek: a SUCCESS
    stays, anything else is overwritten by the RETRY."""
    task_id = uuid.uuid4().hex
    key = _result_ride.meta_key(backend, task_id)
    _result_ride.peek(key, None)
    old_limit = sys.getrecursionlimit()
    sys.setrecursionlimit(10_000)
    try:
        deep: Any = []
        for _ in range(1_200):
            deep = [deep]
        backend.client.set(key, backend.encode({"result": deep, "status": stored}))
        _result_ride.arm_peek()
        reads = _reads(monkeypatch)
        backend.store_result(task_id, ValueError("again"), states.RETRY)
        assert reads == [key], "Celery's own read decided"
        expected = states.SUCCESS if stored == states.SUCCESS else states.RETRY
        assert backend.get_task_meta(task_id)["status"] == expected
    finally:
        sys.setrecursionlimit(old_limit)


def test_a_write_ensure_repeats_checks_again(
        backend: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The connection dropped during the guarded write and the successor stored SUCCESS
    before Celery's ``ensure`` tried again: the repeat checks too, and keeps the SUCCESS."""
    import redis

    task_id, saved = uuid.uuid4().hex, []
    key = _result_ride.meta_key(backend, task_id)
    _result_ride.peek(key, None)
    assert _ride(backend, JobRecord(task_id, "t", "q", 3).started(1), saved)
    _result_ride.arm_peek()
    real, tries = _result_ride.redis_wire.transaction, []

    def dropped_once(client: Any, commands: Any) -> Any:
        tries.append([command[0] for command in commands])
        if len(tries) == 1:
            _in_another_thread(lambda: backend.store_result(task_id, "done", states.SUCCESS))
            raise redis.ConnectionError("connection lost")
        return real(client, commands)

    monkeypatch.setattr(_result_ride.redis_wire, "transaction", dropped_once)
    backend.store_result(task_id, ValueError("again"), states.RETRY)
    assert backend.get_task_meta(task_id)["result"] == "done"
    assert tries == [["EVAL", "EVAL"], ["EVAL"]], "the repeat went guarded, without the rider"
    _result_ride.finish()
    assert saved == ["alone"]  # the rider's try was lost with the connection: saved alone


def test_a_write_whose_fallback_read_is_cut_repeats_guarded(
        backend: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A meta Lua cannot read sends the decision to Celery's read; that read lost its
    connection, and ``ensure`` tries the write again: the repeat checks in its script too."""
    import redis

    task_id = uuid.uuid4().hex
    key = _result_ride.meta_key(backend, task_id)
    _result_ride.peek(key, None)
    deep: Any = []
    for _ in range(1_200):  # deeper than Lua's JSON reads: the script answers -1
        deep = [deep]
    old_limit = sys.getrecursionlimit()
    sys.setrecursionlimit(10_000)
    backend.client.set(key, json.dumps({"result": deep, "status": states.STARTED}))
    _result_ride.arm_peek()
    real_get, gets = _result_ride._ORIGINAL_GET[0], []

    def cut_once(self: Any, k: Any) -> Any:
        gets.append(k)
        if len(gets) == 1:
            raise redis.ConnectionError("connection lost")
        return real_get(self, k)

    real, tries = _result_ride.redis_wire.transaction, []

    def noted(client: Any, commands: Any) -> Any:
        tries.append([command[0] for command in commands])
        return real(client, commands)

    monkeypatch.setattr(_result_ride, "_ORIGINAL_GET", [cut_once])
    monkeypatch.setattr(_result_ride.redis_wire, "transaction", noted)
    try:
        backend.store_result(task_id, ValueError("again"), states.RETRY)
        assert tries == [["EVAL"], ["EVAL"]], "the repeat went unguarded"
        assert backend.get_task_meta(task_id)["status"] == states.RETRY
    finally:
        monkeypatch.undo()
        sys.setrecursionlimit(old_limit)


def test_a_rider_redis_refuses_beside_a_guarded_write_is_saved_alone(
        backend: Any) -> None:
    task_id, saved = uuid.uuid4().hex, []
    store = RecordStore(backend)
    key = _result_ride.meta_key(backend, task_id)
    record_key = backend.get_key_for_task(task_id, key=".ojs")
    backend.client.rpush(record_key, "not a record")  # the save's script errors: WRONGTYPE
    keys, args = store._save_call(record_key, JobRecord(task_id, "t", "q", 3).started(1), None)
    assert _result_ride.attach(backend, task_id, ORDERED_SAVE_LUA, keys, args,
                               lambda: saved.append("alone"))
    _result_ride.peek(key, None)
    _result_ride.arm_peek()
    backend.store_result(task_id, ValueError("again"), states.RETRY)  # raises nothing
    assert backend.get_task_meta(task_id)["status"] == states.RETRY
    _result_ride.finish()
    assert saved == ["alone"]


def _guarded_retry_reads(backend: Any, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The meta reads that go to Redis when ``backend`` stores a RETRY after a guarded peek."""
    backend.task_keyprefix = f"ojs-test-ride-{uuid.uuid4().hex[:8]}-".encode()
    task_id = uuid.uuid4().hex
    key = _result_ride.meta_key(backend, task_id)
    assert key is not None
    _result_ride.peek(key, None)
    _result_ride.arm_peek()
    reads = _reads(monkeypatch)
    try:
        backend.store_result(task_id, ValueError("again"), states.RETRY)
        assert backend.get_task_meta(task_id)["status"] == states.RETRY
    finally:
        backend.client.delete(key)
    return [read for read in reads if read == key]


def test_a_backend_with_its_own_set_keeps_celerys_read(
        redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write that may not go through ``_set`` cannot be checked in the script."""
    from celery.backends.redis import RedisBackend

    class AuditedBackend(RedisBackend):  # type: ignore[misc]
        def set(self, key: Any, value: Any, **options: Any) -> Any:
            return super().set(key, value, **options)

    app = Celery(f"ride-{uuid.uuid4().hex[:8]}", broker="memory://", backend=redis_url)
    assert _guarded_retry_reads(AuditedBackend(app=app, url=redis_url), monkeypatch), \
        "Celery's read before the store went"


def test_a_serializer_lua_cannot_read_keeps_celerys_read(
        redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    app = Celery(f"ride-{uuid.uuid4().hex[:8]}", broker="memory://", backend=redis_url)
    app.conf.result_serializer = "pickle"
    app.conf.result_accept_content = ["pickle", "json"]
    assert _guarded_retry_reads(app.backend, monkeypatch), "Celery's read before the store went"
