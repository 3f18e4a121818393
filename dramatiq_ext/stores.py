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
read-modify-write is enough for the record. Two *copies* of one attempt (a retry
published twice) can run at once, though, so each attempt is first *claimed*
(``claim``): an atomic first-writer-wins mark (``SET NX`` on Redis, a lock in
memory). A store without ``claim`` (a ``Results`` backend other than Redis) lets
every copy through: the record check then catches only copies that arrive after
the first one started.

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

from ojs_adapters.handoff import Claim

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


def _redis_claim(client: Any, key: str, token: str, ttl: int) -> Claim:
    if client.set(key, token, nx=True, px=ttl):
        return "new"
    held = client.get(key)
    return "new" if held is None else claim_of(held, token)


def claim_of(held: str | bytes, token: str) -> Claim:
    """How the claim value ``held`` relates to ``token`` (both ``<copy>|<delivery>``)."""
    value = held.decode() if isinstance(held, bytes) else held
    if value == token:
        return "new"
    return "mine" if value.split("|")[0] == token.split("|")[0] else "other"


class MemoryRecordStore:
    """Records in this process's memory; for ``StubBroker`` and tests.

    A registry by construction: the whole point is to hold state. Expired
    records are dropped when read.
    """

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
        text = json.dumps(record, separators=(",", ":"))
        with self._lock:
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


class RedisRecordStore:
    """Records as JSON strings in Redis under ``<prefix>:<message_id>``.

    Give either a ``redis.Redis`` client or a URL.

    >>> store = RedisRecordStore(url="redis://127.0.0.1:6379/0", prefix="myapp:ojs-record")
    """

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

    def load(self, message_id: str) -> dict[str, Any] | None:
        raw = self.client.get(f"{self.prefix}:{message_id}")
        if raw is None:
            return None
        data: dict[str, Any] = json.loads(raw)
        return data

    def save(self, message_id: str, record: Mapping[str, Any]) -> None:
        text = json.dumps(record, separators=(",", ":"))
        self.client.set(f"{self.prefix}:{message_id}", text, px=self.ttl)

    def claim(self, key: str, token: str, ttl: int) -> Claim:
        """First writer wins (see ``claim``): ``SET NX`` on ``<prefix>:claim:<key>``."""
        return _redis_claim(self.client, f"{self.prefix}:claim:{key}", token, ttl)


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
        self.backend._store(key, wrap(dict(record)), self.ttl)

    def claim(self, key: str, token: str, ttl: int) -> Claim:
        """First writer wins on a Redis backend; granted on others (see ``claim``)."""
        client = getattr(self.backend, "client", None)
        if client is None or not hasattr(client, "set"):
            return "new"
        name = self.backend.build_message_key(_RecordKey(_RESULTS_QUEUE, "ojs-claim", key))
        return _redis_claim(client, name, token, ttl)


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
