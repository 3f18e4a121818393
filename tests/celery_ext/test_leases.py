"""Attempt leases in the Celery record store (``ojs_adapters.runtime.leases``), on the real Redis
result backend: one holder at a time, renewable by its holder, released only by it."""

from __future__ import annotations

import time
import uuid

import pytest
from celery import Celery

from celery_ext import JobDiscarded
from celery_ext.records import LEASE_SUFFIX, RecordStore
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
