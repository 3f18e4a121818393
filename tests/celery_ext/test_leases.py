"""Attempt leases in the Celery record store (``ojs_adapters.runtime.leases``), on the real Redis
result backend: one holder at a time, renewable by its holder, released only by it."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest
from celery import Celery, states

from celery_ext import JobDiscarded
from celery_ext.records import LEASE_SUFFIX, RecordStore
from ojs_adapters import JobRecord
from ojs_adapters.runtime.events import DecisionEvent, add_hook, remove_hook
from ojs_adapters.runtime.leases import BEAT_SECONDS, LeaseRenewer, lease, release
from tests.celery_ext.conftest import Env

BEAT = LeaseRenewer()


def test_a_lease_has_one_holder_and_only_its_holder_releases_it(redis_url: str) -> None:
    app = Celery("ojs-lease-test", broker="memory://", backend=redis_url, set_as_current=False)
    store = RecordStore(app.backend)
    key = f"ojs-lease-test-{uuid.uuid4().hex}:2"
    try:
        assert lease(store, key, "copy|a", 5000) is True
        assert lease(store, key, "copy|b", 5000) is False  # another live delivery holds it
        assert lease(store, key, "copy|a", 5000) is True  # renewed by its holder
        release(BEAT, store, key, "copy|b")  # not the holder: nothing changes
        assert lease(store, key, "copy|b", 5000) is False
        release(BEAT, store, key, "copy|a")
        assert lease(store, key, "copy|b", 5000) is True  # free at once, no lapse to wait for
    finally:
        release(BEAT, store, key, "copy|b")


def test_a_lease_is_alive_only_while_surely_held(redis_url: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """What the result-meta peek relies on: taken or renewed within LEASE_SECONDS -
    BEAT_SECONDS, never lost to another delivery, not dropped."""
    from ojs_adapters.runtime import leases

    app = Celery("ojs-lease-test", broker="memory://", backend=redis_url, set_as_current=False)
    store, renewer = RecordStore(app.backend), LeaseRenewer()
    key = f"ojs-lease-test-{uuid.uuid4().hex}:1"
    try:
        assert lease(store, key, "copy|a", 5000)
        renewer.hold(store, key, "copy|a")
        assert renewer.alive("copy|a") and not renewer.alive("copy|b")
        now = time.monotonic()
        monkeypatch.setattr(leases.time, "monotonic", lambda: now + leases.LEASE_SECONDS)
        assert not renewer.alive("copy|a")  # no renewal for too long: maybe lapsed
        monkeypatch.undo()
        renewer.beat()  # renewed: alive again
        assert renewer.alive("copy|a")
        release(BEAT, store, key, "copy|a")
        assert lease(store, key, "copy|b", 5000)  # another delivery took it
        renewer.beat()
        assert not renewer.alive("copy|a")
    finally:
        release(BEAT, store, key, "copy|b")


def test_backends_other_than_redis_keep_no_leases() -> None:
    app = Celery("ojs-lease-test", broker="memory://", backend="cache+memory://",
                 set_as_current=False)
    store = RecordStore(app.backend)
    assert lease(store, "job:1", "copy|a", 5000) is None
    release(BEAT, store, "job:1", "copy|a")  # a no-op, no error


def test_the_lease_stays_released_while_hooks_run_after_the_outcome(env: Env) -> None:
    """The outcome's save releases the lease (one round trip); renewals stop before it, so
    a heartbeat beat during the decision hooks that follow cannot take the lease again (a
    redelivery would then wait for a live-looking lease for up to 6 s)."""
    backend = env.app.backend
    if not RecordStore(backend).leases:
        pytest.skip(f"the {env.name} setup keeps no leases")

    def slow_hook(event: DecisionEvent) -> None:
        if event.decision.action != "retry":
            time.sleep(BEAT_SECONDS * 1.3)  # at least one beat of the lease heartbeat

    add_hook(slow_hook)
    try:
        result = env.tasks["scripted"].apply_async(
            (["raise:value"],), queue=env.take_queue(), retry_policy={"max_attempts": 1})
        with pytest.raises(JobDiscarded):
            result.get(timeout=30)
    finally:
        remove_hook(slow_hook)
    time.sleep(BEAT_SECONDS * 1.5)
    lease_key = backend.get_key_for_task(f"{result.id}:1", key=LEASE_SUFFIX)
    assert backend.client.get(lease_key) is None


def test_a_renewal_on_its_way_when_the_lease_is_given_up_does_not_keep_it(
        redis_url: str) -> None:
    """The delivery stops renewals and releases its lease while a beat's renewal is still
    on its way; the renewal lands after the release and takes the lease again: the next
    beat gives it back (not at once: the release it crossed may still be on its way), so
    the next delivery does not wait out a lease nobody holds."""
    app = Celery("ojs-lease-test", broker="memory://", backend=redis_url, set_as_current=False)
    store, renewer = RecordStore(app.backend), LeaseRenewer()
    key = f"ojs-lease-test-{uuid.uuid4().hex}:1"
    lease_key = app.backend.get_key_for_task(key, key=LEASE_SUFFIX)

    class Late:
        """The store, with a renewal that lands only after the delivery gave the lease up."""

        def __getattr__(self, name: str) -> Any:
            return getattr(store, name)

        def lease(self, *args: Any, **kwargs: Any) -> Any:
            release(renewer, store, key, "copy|a")  # meanwhile: renewals stop, released
            assert app.backend.client.get(lease_key) is None
            return store.lease(*args, **kwargs)  # the renewal lands: taken again

    try:
        assert lease(store, key, "copy|a", 5000)
        renewer.hold(Late(), key, "copy|a")
        renewer.beat()
        assert app.backend.client.get(lease_key) is not None  # taken again, for now
        assert not renewer.alive("copy|a")
        renewer.beat()
        assert app.backend.client.get(lease_key) is None
    finally:
        release(BEAT, store, key, "copy|a")


def test_the_last_save_keeps_the_lease_renewed_until_the_result_write(
        redis_url: str) -> None:
    """The outcome rides in Celery's result write, after the link callbacks and the like:
    until it is stored the lease stays renewed (a redelivery meanwhile waits for it instead
    of taking a finished attempt as lost), and renewals stop as that write goes."""
    from celery_ext import _result_ride
    from celery_ext._seat import LEASES, AttemptSeat

    app = Celery("ojs-lease-test", broker="memory://", backend=redis_url, set_as_current=False)

    @app.task(bind=True, shared=False)
    def job(self: Any) -> None: ...

    task_id = uuid.uuid4().hex
    job.push_request(id=task_id, headers={}, delivery_info={})
    try:
        seat = AttemptSeat(job)
        assert lease(seat.store, seat.claim_key(), seat.token(), 5000)
        seat.hold_lease()
        seat.save(JobRecord(task_id, job.name, "q", 3).started(1).completed(), last=True)
        seat.release_lease()  # the end of run_attempt: the write has not come yet
        assert LEASES.alive(seat.holder), "renewals stopped before the outcome was stored"
        app.backend.store_result(task_id, None, states.SUCCESS)  # the ride goes with it
        assert not LEASES.alive(seat.holder)
        lease_key = app.backend.get_key_for_task(seat.claim_key(), key=LEASE_SUFFIX)
        assert app.backend.client.get(lease_key) is None  # released in that transaction
        record = seat.store.load(task_id)
        assert record is not None and record.state == "completed"
    finally:
        _result_ride.finish()
        job.pop_request()
        app.backend.client.delete(app.backend.get_key_for_task(task_id),
                                  app.backend.get_key_for_task(task_id, key=".ojs"))


def test_a_thread_renews_the_lease_of_its_latest_delivery_only(redis_url: str) -> None:
    """A lease its delivery never dropped (an exception in the wrong place) is renewed no
    more once the same thread takes the lease of its next delivery."""
    app = Celery("ojs-lease-test", broker="memory://", backend=redis_url, set_as_current=False)
    store, renewer = RecordStore(app.backend), LeaseRenewer()
    first, second = (f"ojs-lease-test-{uuid.uuid4().hex}:1" for _ in range(2))
    try:
        assert lease(store, first, "copy|a", 5000) and lease(store, second, "copy|b", 5000)
        renewer.hold(store, first, "copy|a")
        renewer.hold(store, second, "copy|b")
        assert not renewer.alive("copy|a") and renewer.alive("copy|b")
        other: list[bool] = []
        worker = threading.Thread(target=lambda: (renewer.hold(store, first, "copy|a"),
                                                  other.append(renewer.alive("copy|b"))))
        worker.start()
        worker.join()
        assert other == [True]  # another thread's delivery is its own
    finally:
        release(BEAT, store, first, "copy|a")
        release(BEAT, store, second, "copy|b")
