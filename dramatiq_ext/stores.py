"""Where ``OjsRetries`` keeps job records, readable by message id during and after the job.

Dramatiq's ``Results`` keeps nothing for an attempt that is retried, so the record has a
key of its own. ``default_store`` picks the ``Results`` backend, else the ``RedisBroker``'s
Redis, else process memory; ``claim`` and ``saves_in_order`` are the calls made through any
store. The stores live in ``_store_memory``, ``_store_redis`` and ``_store_results``; what
each one guarantees is in docs/getting-started/dramatiq-redis.md.

>>> store = MemoryRecordStore()
>>> store.save("m1", {"id": "m1", "state": "active"})
>>> store.load("m1")["state"]
'active'
"""

from __future__ import annotations

from typing import Any, cast

from dramatiq_ext._store_memory import MemoryRecordStore
from dramatiq_ext._store_protocol import DEFAULT_RECORD_TTL, RecordStore
from dramatiq_ext._store_redis import RedisRecordStore
from dramatiq_ext._store_results import _RESULTS_QUEUE as _RESULTS_QUEUE
from dramatiq_ext._store_results import ResultsRecordStore
from dramatiq_ext._store_results import _RecordKey as _RecordKey
from ojs_adapters.runtime.handoff import Claim

__all__ = [
    "DEFAULT_RECORD_TTL",
    "MemoryRecordStore",
    "RecordStore",
    "RedisRecordStore",
    "ResultsRecordStore",
    "claim",
    "default_store",
    "saves_in_order",
]


def claim(store: Any, key: str, token: str, ttl: int) -> Claim:
    """Claim ``key`` for ``token`` in ``store`` (first writer wins, for ``ttl`` ms).

    ``token`` is ``<copy token>|<delivery nonce>``: ``"new"`` if this delivery
    took it (now, or in a try whose reply was lost), ``"mine"`` if an earlier
    delivery of the same copy did, ``"other"`` if another copy got it first.
    Stores without a ``claim`` method grant every claim as ``"new"``.

    >>> store = MemoryRecordStore()
    >>> [claim(store, "m1:2", token, 1000) for token in ("a|1", "b|2", "a|1", "a|3")]
    ['new', 'other', 'new', 'mine']
    """
    method = getattr(store, "claim", None)
    return "new" if method is None else cast(Claim, method(key, token, ttl))


def saves_in_order(store: Any) -> bool:
    """Whether ``store.save`` keeps a stored record of a later attempt (``record_rank``)."""
    return bool(getattr(store, "ordered", False))


def default_store(broker: Any, *, ttl: int = DEFAULT_RECORD_TTL) -> RecordStore:
    """The store for ``broker`` when none was given (see the module docstring)."""
    try:
        return ResultsRecordStore(broker.get_results_backend(), ttl=ttl)
    except RuntimeError:
        pass
    try:
        from dramatiq.brokers.redis import RedisBroker
    except ImportError:  # dramatiq installed without its redis extra
        return MemoryRecordStore(ttl=ttl)
    if isinstance(broker, RedisBroker):
        return RedisRecordStore(client=broker.client, prefix=f"{broker.namespace}:ojs-record",
                                ttl=ttl)
    return MemoryRecordStore(ttl=ttl)
