"""``ResultsRecordStore``: job records in a Dramatiq ``Results`` backend.

A record goes under ``backend.build_message_key`` of the pseudo message
``ojs-record/<id>`` (queue ``ojs``), beside the actors' results; on a Redis backend
saves are ordered and claims and leases kept, as in ``_store_redis``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from dramatiq_ext._store_protocol import DEFAULT_RECORD_TTL
from dramatiq_ext._store_redis import _redis_claim, _RedisScripts
from ojs_adapters.runtime.handoff import Claim

#: The pseudo queue and actor under which records sit in a Results backend.
_RESULTS_QUEUE, _RESULTS_ACTOR = "ojs", "ojs-record"


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
        """First writer wins on a Redis backend; granted on others (see ``stores.claim``)."""
        client = getattr(self.backend, "client", None)
        if client is None or not hasattr(client, "set"):
            return "new"
        name = self.backend.build_message_key(_RecordKey(_RESULTS_QUEUE, "ojs-claim", key))
        return _redis_claim(client, name, token, ttl)

    def lease(self, key: str, holder: str, ttl: int) -> bool | None:
        """See ``leases.lease``, on a Redis backend (``None``: others keep no leases)."""
        if self._scripts is None:
            return None
        name = self.backend.build_message_key(_RecordKey(_RESULTS_QUEUE, "ojs-lease", key))
        return self._scripts.lease(name, holder, ttl)
