"""Where ``OjsRetries`` keeps job records, readable by message id during and after the job.

Dramatiq's ``Results`` middleware stores only a success or a dead-lettered failure,
and nothing for an attempt that is retried, so the record (DESIGN.md "Job record")
has a key of its own. Which store, unless ``OjsRetries(store=...)`` names one:

1. the ``Results`` backend, when the broker has that middleware: the record goes
   under ``backend.build_message_key`` of the pseudo message ``ojs-record/<id>``,
   through the backend's own ``_store`` and read back with ``get_result``;
2. the broker's Redis, for a ``RedisBroker``: ``<namespace>:ojs-record:<id>``;
3. process memory (``MemoryRecordStore``), for ``StubBroker``, and for a
   ``RabbitmqBroker`` without ``Results``. Memory is per process: another process
   cannot read the record, and a worker that replaces a killed one cannot see that
   the attempt was running, so worker crashes go undetected. Give a RabbitMQ
   deployment ``Results`` or ``store=RedisRecordStore(url=...)``.

Records expire after ``ttl`` milliseconds (7 days by default, Dramatiq's
dead-message TTL). One worker at a time works on a message, so a plain
read-modify-write is enough for the record, and saves are *ordered*: a save never
replaces a record of a later attempt or replay round
(``ojs_adapters.runtime.handoff.record_rank``), as a late ``handed_off`` mark would after
its successor already ran (atomically on Redis, one script: ``ORDERED_SAVE_LUA``;
on a ``Results`` backend only when it is Redis with JSON values). Two *copies*
of one attempt (a retry published twice) can run at once, though, so each
attempt is first *claimed* (``claim``): an atomic first-writer-wins mark (``SET
NX`` on Redis, a lock in memory). A store without ``claim`` (a ``Results`` backend
other than Redis) lets every copy through: the record check then catches only
copies that arrive after the first one started.

Before it claims, a delivery takes a *lease* on its attempt (``lease``, kept alive
by ``_lease``): a second delivery of the same attempt waits while a live one holds
it, and goes on once a dead one's lapses. Stores without ``lease`` keep none.

This module chooses the store and holds the calls made through any store; the stores
themselves live in ``_store_memory``, ``_store_redis`` and ``_store_results``.

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
    """Whether ``store.save`` keeps a stored record of a later attempt (see above)."""
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
