"""The job record (DESIGN.md "Job record") in Celery's result backend.

Celery rewrites a task's whole result meta on every RETRY and FAILURE write
(``backends/base.py`` ``store_result``), so the record lives under a key of its
own: ``<task meta key>.ojs`` on key-value backends (Redis, memcached,
``cache+memory``), or as the meta of the pseudo task ``<task id>.ojs`` on
others (database). It is rewritten at each step: ``active`` when an attempt
starts, ``retryable`` with ``next_retry_at`` while a retry waits, and
``completed`` or ``discarded`` at the end. The RPC backend and no backend at
all keep no record; the history still travels in the message headers.

Saves are ordered: on the Redis backend a save never replaces a record of a
later attempt or replay round (``ojs_adapters.runtime.handoff.record_rank``), in one
atomic script (``ORDERED_SAVE_LUA``). The ``handed_off`` mark is written after the
retry was accepted, and that retry may already have run and stored its own
record. Other backends write as told.

>>> from celery import Celery
>>> app = Celery("demo", broker="memory://", backend="cache+memory://")
>>> get_job_record("no-such-task", app=app) is None
True
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from celery.backends.base import BaseKeyValueStoreBackend, DisabledBackend
from celery.backends.rpc import RPCBackend

from celery_ext._publish_ride import attach as ride_publish
from celery_ext._result_ride import attach
from ojs_adapters import JobRecord
from ojs_adapters.runtime.claims import AdmissionReply, begin_on_redis, claim_of
from ojs_adapters.runtime.group_commit import run_script
from ojs_adapters.runtime.handoff import ORDERED_SAVE_LUA, Claim, record_rank
from ojs_adapters.runtime.leases import LEASE_LUA, RELEASE_LUA

#: Suffix of the record's key (key-value backends) or pseudo task id (others).
RECORD_SUFFIX = ".ojs"
#: Suffix of the key of an attempt's claim (``<task id>:<attempt>``).
CLAIM_SUFFIX = ".ojs-claim"
#: Suffix of the key of an attempt's lease (``ojs_adapters.runtime.leases``).
LEASE_SUFFIX = ".ojs-lease"
#: Result state under which non key-value backends hold a record.
RECORD_STATE = "OJS_RECORD"


def get_job_record(task_id: str, *, app: Any) -> JobRecord | None:
    """The job record of Celery task ``task_id``, or ``None`` if none was stored.

    Readable while the job runs (``state == "active"``), while it waits for a
    retry (``"retryable"``, ``next_retry_at``) and after it ended.

    >>> # rec = get_job_record(result.id, app=app); rec.state, rec.attempt, rec.errors
    """
    return RecordStore(app.backend).load(task_id)


class RecordStore:
    """Reads and writes job records through a Celery result backend."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        #: RPC "stores" results as reply messages, read once: no place for a record.
        self.enabled = not isinstance(backend, (DisabledBackend, RPCBackend))
        self._key_value = isinstance(backend, BaseKeyValueStoreBackend)
        #: Leases, attempt claims and ordered saves need Redis scripts; others only store.
        self.leases = self.enabled and _is_redis(backend)
        self._keys: dict[tuple[str, str], Any] = {}

    def key(self, task_id: str, suffix: str) -> Any:
        """``backend.get_key_for_task(task_id, key=suffix)``, once per store and key (an
        attempt asks for the same few keys about seven times)."""
        found = self._keys.get((task_id, suffix))
        if found is None:
            if len(self._keys) >= 16:  # a long-lived store (a console, a scan): no growth
                self._keys.clear()
            found = self._keys[task_id, suffix] = self.backend.get_key_for_task(
                task_id, key=suffix)
        return found

    def load(self, task_id: str) -> JobRecord | None:
        """The stored record, or ``None``."""
        if not self.enabled:
            return None
        if self._key_value:
            raw = self.backend.get(self.key(task_id, RECORD_SUFFIX))
            if raw is None:
                return None
            return JobRecord.from_dict(json.loads(raw))
        meta = self.backend.get_task_meta(task_id + RECORD_SUFFIX)
        if meta.get("status") != RECORD_STATE or not isinstance(meta.get("result"), dict):
            return None
        return JobRecord.from_dict(meta["result"])

    def save(self, record: JobRecord, *, force: bool = False,
             release: tuple[str, str] | None = None) -> bool:
        """Store ``record`` (no-op without a storing backend).

        On Redis a stored record of a later attempt or replay round is kept (see the
        module docstring); ``force`` replaces it anyway (putting an earlier record back).
        ``release`` (attempt key, holder) gives up that lease in the same round trip;
        the return says whether it was (else the caller releases it itself).
        """
        if not self.enabled:
            return False
        if not self._key_value:
            self.backend.store_result(record.id + RECORD_SUFFIX, record.to_dict(), RECORD_STATE)
            return False
        key = self.key(record.id, RECORD_SUFFIX)
        if self.leases:
            # Not RedisBackend.set: it writes with SETEX (deprecated by redis-py) and
            # PUBLISHes the value for result waiters, which a record never has.
            self.backend.ensure(self._redis_save, (key, record, force, release))
            return release is not None and not force
        self.backend.set(key, record.to_json())
        return False

    def _redis_save(self, key: str, record: JobRecord, force: bool,
                    release: tuple[str, str] | None) -> None:
        """One round trip: ``SET`` (``force``) or the ordered save script (and release)."""
        client, expires = self.backend.client, self.backend.expires
        if force:
            client.set(key, record.to_json(), ex=expires or None)
            return
        run_script(client, ORDERED_SAVE_LUA, *self._save_call(key, record, release))

    def _save_call(self, key: str, record: JobRecord,
                   release: tuple[str, str] | None) -> tuple[list[Any], list[Any]]:
        """The keys and arguments of ``ORDERED_SAVE_LUA`` saving ``record`` (and releasing)."""
        data = record.to_dict()
        keys: list[Any] = [key]
        args: list[Any] = [json.dumps(data, separators=(",", ":")), *record_rank(data),
                           int((self.backend.expires or 0) * 1000), "string"]
        if release is not None:
            keys.append(self.key(release[0], LEASE_SUFFIX))
            args.append(release[1])
        return keys, args

    def save_with_result(self, record: JobRecord, release: tuple[str, str] | None,
                         save: Callable[[], None],
                         after: Callable[[], None] | None = None) -> bool:
        """Let this save ride in the transaction of Celery's next result write of the
        task (``_result_ride``); ``save`` is how to do it alone if that write does not
        come; ``after`` runs once it is done. ``False``: it cannot ride here (not the
        Redis backend): save it now."""
        if not self.leases:
            return False
        key = self.key(record.id, RECORD_SUFFIX)
        keys, args = self._save_call(key, record, release)
        return attach(self.backend, record.id, ORDERED_SAVE_LUA, keys, args, save, after)

    def save_with_publish(self, app: Any, record: JobRecord, queue: str, *,
                          first: bool, alone: Callable[[], None] | None = None) -> bool:
        """Let this save ride in the ``MULTI`` of this thread's next push to ``queue``, before
        it (``first``: a retry's record) or after it (a dead letter's mark), when the broker
        is this backend's Redis (``_publish_ride``, ``app``'s broker). ``False``: it cannot:
        save it alone.
        Call ``_publish_ride.finish`` after the publish, to know whether it rode."""
        if not self.leases:
            return False
        key = self.key(record.id, RECORD_SUFFIX)
        keys, args = self._save_call(key, record, None)
        return ride_publish(app, self.backend.client, queue, ORDERED_SAVE_LUA, keys, args,
                            first=first, alone=alone)

    def claim(self, key: str, token: str) -> Claim:
        """Claim attempt ``key`` for the copy ``token`` (``ojs_adapters.runtime.handoff.Claim``).

        ``token`` is ``<copy token>|<delivery nonce>``. First writer wins,
        atomically, on the Redis backend (``SET NX`` on ``<key prefix><key>.ojs-claim``):
        ``"new"``, or ``"mine"`` for a redelivery of the same copy, or ``"other"``.
        Other backends grant every claim as ``"new"`` (the record check remains).
        """
        client = self._redis_client()
        if client is None:
            return "new"
        name = self.key(key, CLAIM_SUFFIX)
        if client.set(name, token, nx=True, ex=self._claim_ttl()):
            return "new"
        held = client.get(name)
        return "new" if held is None else claim_of(held, token)

    def begin(self, key: str, token: str, started: JobRecord, *,
              rounds: tuple[int, int] = (0, 0), lease_ms: int | None = None,
              peek: str | None = None) -> AdmissionReply | None:
        """``claim`` and ``load`` in one round trip on the Redis backend, saving
        ``started`` when the claim is new and the stored record (if any) ranks below it
        (an earlier attempt, or round: ``rounds``); ``None`` on other backends (then one
        call each).
        The returned ``AdmissionReply.record`` is the record as it was before. With
        ``lease_ms``, the attempt's lease is taken for ``token`` first, in the same call
        (``AdmissionReply.leased``), and the value of key ``peek`` read with it."""
        client = self._redis_client()
        if client is None:
            return None
        expires = self.backend.expires
        return begin_on_redis(
            client, claim_key=self.key(key, CLAIM_SUFFIX),
            record_key=self.key(started.id, RECORD_SUFFIX),
            token=token, claim_ttl_ms=self._claim_ttl() * 1000, started=started.to_json(),
            record_ttl_ms=int(expires * 1000) if expires else None, attempt=started.attempt,
            rounds=rounds,
            lease_key=None if lease_ms is None else self.key(key, LEASE_SUFFIX),
            lease_ttl_ms=lease_ms or 0, peek_key=peek)

    def lease(self, key: str, holder: str, ttl: int) -> bool | None:
        """Take or renew the lease on attempt ``key`` for delivery ``holder``, for ``ttl`` ms
        (``ojs_adapters.runtime.leases``): ``False`` while another delivery holds it; ``None`` on
        backends other than Redis, which keep no leases."""
        client = self._redis_client()
        if client is None:
            return None
        name = self.key(key, LEASE_SUFFIX)
        return bool(run_script(client, LEASE_LUA, [name], [holder, ttl]))

    def release_lease(self, key: str, holder: str) -> None:
        """Drop the lease on attempt ``key`` if ``holder`` still holds it (Redis backend)."""
        client = self._redis_client()
        if client is None:
            return
        run_script(client, RELEASE_LUA, [self.key(key, LEASE_SUFFIX)],
                   [holder])

    def _redis_client(self) -> Any | None:
        """The Redis client of a storing Redis backend (claims, leases, ``begin``), else
        ``None``: other backends keep none of those."""
        return self.backend.client if self.leases else None

    def _claim_ttl(self) -> int:
        """Seconds a claim is kept: the backend's result expiry, else a day."""
        return int(self.backend.expires or 86_400)

    def release(self, key: str) -> None:
        """Drop the claim on attempt ``key`` (the attempt will be delivered afresh)."""
        client = self._redis_client()
        if client is not None:
            client.delete(self.key(key, CLAIM_SUFFIX))

    def delete(self, task_id: str) -> None:
        """Remove the stored record, if any."""
        if not self.enabled:
            return
        if self._key_value:
            self.backend.delete(self.key(task_id, RECORD_SUFFIX))
        else:
            self.backend.forget(task_id + RECORD_SUFFIX)


def _is_redis(backend: Any) -> bool:
    """Whether ``backend`` is Celery's Redis result backend, without importing redis.

    ``celery.backends.redis`` imports redis-py, which a RabbitMQ + ``rpc://`` setup
    need not have; a ``RedisBackend`` instance exists only once that module is loaded.
    """
    module = sys.modules.get("celery.backends.redis")
    return module is not None and isinstance(backend, module.RedisBackend)
