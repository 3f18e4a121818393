"""The last record save of an attempt rides in Celery's own result transaction (Redis)."""

from __future__ import annotations

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


def _ride(backend: Any, record: JobRecord, saved: list[str]) -> bool:
    return RecordStore(backend).save_with_result(record, None, lambda: saved.append("alone"))


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
    reads: list[Any] = []
    real = _result_ride._ORIGINAL_GET[0]
    monkeypatch.setattr(_result_ride, "_ORIGINAL_GET",
                        [lambda self, k: reads.append(k) or real(self, k)])
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
