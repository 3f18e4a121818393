"""Attempt leases in the Celery record store (``ojs_adapters.leases``), on the real Redis
result backend: one holder at a time, renewable by its holder, released only by it."""

from __future__ import annotations

import uuid

from celery import Celery

from celery_ext.records import RecordStore
from ojs_adapters.leases import Heartbeat, lease, release

BEAT = Heartbeat()


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


def test_backends_other_than_redis_keep_no_leases() -> None:
    app = Celery("ojs-lease-test", broker="memory://", backend="cache+memory://",
                 set_as_current=False)
    store = RecordStore(app.backend)
    assert lease(store, "job:1", "copy|a", 5000) is None
    release(BEAT, store, "job:1", "copy|a")  # a no-op, no error
