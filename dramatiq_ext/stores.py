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
(``ojs_adapters.handoff.record_rank``), as a late ``handed_off`` mark would after
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

>>> store = MemoryRecordStore()
>>> store.save("m1", {"id": "m1", "state": "active"})
>>> store.load("m1")["state"]
'active'
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Protocol, cast

from ojs_adapters.claims import Begun, begin_on_redis, claim_of
from ojs_adapters.handoff import ORDERED_SAVE_LUA, Claim, is_newer, record_rank
from ojs_adapters.leases import LEASE_LUA
from ojs_adapters.runtime.group_commit import run_script

#: How long a record is kept, in milliseconds (Dramatiq's dead-message TTL).
DEFAULT_RECORD_TTL = 7 * 86_400_000
#: The pseudo queue and actor under which records sit in a Results backend.
_RESULTS_QUEUE, _RESULTS_ACTOR = "ojs", "ojs-record"


class RecordStore(Protocol):
    """What ``OjsRetries`` needs of a job-record store: JSON objects by message id."""

    def load(self, message_id: str) -> dict[str, Any] | None:
        """The stored record, or ``None``."""

    def save(self, message_id: str, record: Mapping[str, Any]) -> None:
        """Store ``record`` (plain JSON data) for ``message_id``."""


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


#: Take or renew a lease. KEYS[1] the lease; ARGV[1] the holder, ARGV[2] its TTL (ms).


class _RedisScripts:
    """The ordered save and the lease on one Redis client (``group_commit``)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def save(self, key: str, value: str | bytes, record: Mapping[str, Any], ttl: int,
             layout: str) -> None:
        run_script(self.client, ORDERED_SAVE_LUA, [key],
                   [value, *record_rank(record), ttl, layout])

    def lease(self, key: str, holder: str, ttl: int) -> bool:
        return bool(run_script(self.client, LEASE_LUA, [key], [holder, ttl]))


def _redis_claim(client: Any, key: str, token: str, ttl: int) -> Claim:
    if client.set(key, token, nx=True, px=ttl):
        return "new"
    held = client.get(key)
    return "new" if held is None else claim_of(held, token)


class MemoryRecordStore:
    """Records in this process's memory; for ``StubBroker`` and tests.

    A registry by construction: the whole point is to hold state. Expired
    records are dropped when read.
    """

    ordered = True

    def __init__(self, *, ttl: int = DEFAULT_RECORD_TTL) -> None:
        self.ttl = ttl
        self._lock = threading.Lock()
        self._records: dict[str, tuple[str, float]] = {}

    def load(self, message_id: str) -> dict[str, Any] | None:
        with self._lock:
            found = self._records.get(message_id)
            if found is None:
                return None
            if found[1] < time.monotonic():
                del self._records[message_id]
                return None
        data: dict[str, Any] = json.loads(found[0])
        return data

    def save(self, message_id: str, record: Mapping[str, Any]) -> None:
        """Store ``record``, unless the stored one ranks higher (``record_rank``)."""
        text = json.dumps(record, separators=(",", ":"))
        with self._lock:
            found = self._records.get(message_id)
            if found is not None and found[1] >= time.monotonic() and \
                    is_newer(json.loads(found[0]), record):
                return
            self._records[message_id] = (text, time.monotonic() + self.ttl / 1000)

    def claim(self, key: str, token: str, ttl: int) -> Claim:
        """First writer wins (see ``claim``); claims live beside the records."""
        now = time.monotonic()
        with self._lock:
            held = self._records.get("claim:" + key)
            if held is None or held[1] < now:
                self._records["claim:" + key] = (token, now + ttl / 1000)
                return "new"
            return claim_of(held[0], token)

    def lease(self, key: str, holder: str, ttl: int) -> bool:
        """See ``lease``; leases live beside the records."""
        now = time.monotonic()
        with self._lock:
            held = self._records.get("lease:" + key)
            if held is not None and held[1] >= now and held[0] != holder:
                return False
            self._records["lease:" + key] = (holder, now + ttl / 1000)
            return True


class RedisRecordStore:
    """Records as JSON strings in Redis under ``<prefix>:<message_id>``.

    Give either a ``redis.Redis`` client or a URL.

    >>> store = RedisRecordStore(url="redis://127.0.0.1:6379/0", prefix="myapp:ojs-record")
    """

    ordered = True

    def __init__(self, *, client: Any = None, url: str | None = None,
                 prefix: str = "ojs-record", ttl: int = DEFAULT_RECORD_TTL) -> None:
        if client is None:
            import redis

            if url is None:
                raise ValueError("RedisRecordStore needs a client or a url")
            client = redis.Redis.from_url(url)
        self.client = client
        self.prefix = prefix
        self.ttl = ttl
        self._scripts = _RedisScripts(client)

    def load(self, message_id: str) -> dict[str, Any] | None:
        raw = self.client.get(f"{self.prefix}:{message_id}")
        if raw is None:
            return None
        data: dict[str, Any] = json.loads(raw)
        return data

    def save(self, message_id: str, record: Mapping[str, Any]) -> None:
        """Store ``record``, unless the stored one ranks higher: one atomic script."""
        text = json.dumps(record, separators=(",", ":"))
        self._scripts.save(f"{self.prefix}:{message_id}", text, record, self.ttl, "string")

    def claim(self, key: str, token: str, ttl: int) -> Claim:
        """First writer wins (see ``claim``): ``SET NX`` on ``<prefix>:claim:<key>``."""
        return _redis_claim(self.client, f"{self.prefix}:claim:{key}", token, ttl)

    def lease(self, key: str, holder: str, ttl: int) -> bool:
        """See ``lease``: ``<prefix>:lease:<key>``."""
        return self._scripts.lease(f"{self.prefix}:lease:{key}", holder, ttl)

    def begin(self, key: str, token: str, ttl: int, message_id: str,
              started: Mapping[str, Any] | None, *, lease_ms: int | None = None,
              attempt: int | None = None) -> Begun:
        """``claim`` and ``load`` in one round trip, saving ``started`` (if given) when
        both find nothing (a new claim, no record), or, with ``attempt``, a record of an
        earlier attempt: an attempt's whole start. With ``lease_ms``, the attempt's lease
        is taken for ``token`` first, in the same call."""
        text = None if started is None else json.dumps(started, separators=(",", ":"))
        return begin_on_redis(
            self.client, claim_key=f"{self.prefix}:claim:{key}",
            record_key=f"{self.prefix}:{message_id}", token=token, claim_ttl_ms=ttl,
            started=text, record_ttl_ms=self.ttl, attempt=attempt,
            lease_key=None if lease_ms is None else f"{self.prefix}:lease:{key}",
            lease_ttl_ms=lease_ms or 0)


class _RecordKey(NamedTuple):
    """The fields ``ResultBackend.build_message_key`` reads from a message."""

    queue_name: str
    actor_name: str
    message_id: str


class ResultsRecordStore:
    """Records in a Dramatiq ``ResultBackend``, beside (not over) the actors' results."""

    def __init__(self, backend: Any, *, ttl: int = DEFAULT_RECORD_TTL) -> None:
        self.backend = backend
        self.ttl = ttl
        client = getattr(backend, "client", None)
        self._scripts = _RedisScripts(client) if hasattr(client, "register_script") else None

    @property
    def ordered(self) -> bool:
        """Saves are ordered on a Redis backend with JSON values (Dramatiq's default)."""
        from dramatiq.encoder import JSONEncoder

        return self._scripts is not None and isinstance(self.backend.encoder, JSONEncoder)

    def load(self, message_id: str) -> dict[str, Any] | None:
        from dramatiq.results import ResultMissing

        try:
            data = self.backend.get_result(_RecordKey(_RESULTS_QUEUE, _RESULTS_ACTOR, message_id))
        except ResultMissing:
            return None
        return data if isinstance(data, dict) else None

    def save(self, message_id: str, record: Mapping[str, Any]) -> None:
        from dramatiq.results.result import wrap_result

        wrap: Callable[[Any], Any] = wrap_result  # untyped upstream; the identity today
        key = self.backend.build_message_key(_RecordKey(_RESULTS_QUEUE, _RESULTS_ACTOR, message_id))
        if self._scripts is None or not self.ordered:
            self.backend._store(key, wrap(dict(record)), self.ttl)
            return
        value = self.backend.encoder.encode(wrap(dict(record)))  # as ``_store`` would
        self._scripts.save(key, value, record, self.ttl, "list")

    def claim(self, key: str, token: str, ttl: int) -> Claim:
        """First writer wins on a Redis backend; granted on others (see ``claim``)."""
        client = getattr(self.backend, "client", None)
        if client is None or not hasattr(client, "set"):
            return "new"
        name = self.backend.build_message_key(_RecordKey(_RESULTS_QUEUE, "ojs-claim", key))
        return _redis_claim(client, name, token, ttl)

    def lease(self, key: str, holder: str, ttl: int) -> bool | None:
        """See ``lease``, on a Redis backend (``None``: others keep no leases)."""
        if self._scripts is None:
            return None
        name = self.backend.build_message_key(_RecordKey(_RESULTS_QUEUE, "ojs-lease", key))
        return self._scripts.lease(name, holder, ttl)


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
