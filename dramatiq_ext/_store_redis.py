"""``RedisRecordStore`` and the Redis calls every Redis-backed store makes.

The ordered save and the lease are one script each (``group_commit``), the claim a
``SET NX``; ``_store_results`` uses the same calls on a Redis ``Results`` backend.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from dramatiq_ext._store_protocol import DEFAULT_RECORD_TTL
from ojs_adapters.runtime.claims import AdmissionReply, begin_on_redis, claim_of
from ojs_adapters.runtime.group_commit import run_script
from ojs_adapters.runtime.handoff import ORDERED_SAVE_LUA, Claim, record_rank
from ojs_adapters.runtime.leases import LEASE_LUA


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

    def save_call(self, message_id: str, record: Mapping[str, Any]) -> tuple[str, list[Any]]:
        """The key and arguments of the ordered save of ``record`` (``ORDERED_SAVE_BODY``'s
        KEYS[1] and ARGV[1..SAVE_ARGC]), for scripts that save it with something else."""
        text = json.dumps(record, separators=(",", ":"))
        return f"{self.prefix}:{message_id}", [text, *record_rank(record), self.ttl, "string"]

    def claim(self, key: str, token: str, ttl: int) -> Claim:
        """First writer wins (see ``stores.claim``): ``SET NX`` on ``<prefix>:claim:<key>``."""
        return _redis_claim(self.client, f"{self.prefix}:claim:{key}", token, ttl)

    def lease(self, key: str, holder: str, ttl: int) -> bool:
        """See ``leases.lease``: ``<prefix>:lease:<key>``."""
        return self._scripts.lease(f"{self.prefix}:lease:{key}", holder, ttl)

    def begin(self, key: str, token: str, ttl: int, message_id: str,
              started: Mapping[str, Any] | None, *, lease_ms: int | None = None,
              attempt: int | None = None, rounds: tuple[int, int] = (0, 0)) -> AdmissionReply:
        """``claim`` and ``load`` in one round trip, saving ``started`` (if given) when
        both find nothing (a new claim, no record), or, with ``attempt``, a record of an
        earlier attempt: an attempt's whole start. With ``lease_ms``, the attempt's lease
        is taken for ``token`` first, in the same call."""
        text = None if started is None else json.dumps(started, separators=(",", ":"))
        return begin_on_redis(
            self.client, claim_key=f"{self.prefix}:claim:{key}",
            record_key=f"{self.prefix}:{message_id}", token=token, claim_ttl_ms=ttl,
            started=text, record_ttl_ms=self.ttl, attempt=attempt, rounds=rounds,
            lease_key=None if lease_ms is None else f"{self.prefix}:lease:{key}",
            lease_ttl_ms=lease_ms or 0)
