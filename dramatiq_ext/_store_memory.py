"""``MemoryRecordStore``: job records in this process's memory (``StubBroker``, tests).

Memory is per process: another process cannot read a record, so worker crashes go
undetected (docs/getting-started/dramatiq-redis.md).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from typing import Any

from dramatiq_ext._store_protocol import DEFAULT_RECORD_TTL
from ojs_adapters.runtime.claims import claim_of
from ojs_adapters.runtime.handoff import Claim, is_newer


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
        """First writer wins (see ``stores.claim``); claims live beside the records."""
        now = time.monotonic()
        with self._lock:
            held = self._records.get("claim:" + key)
            if held is None or held[1] < now:
                self._records["claim:" + key] = (token, now + ttl / 1000)
                return "new"
            return claim_of(held[0], token)

    def lease(self, key: str, holder: str, ttl: int) -> bool:
        """See ``leases.lease``; leases live beside the records."""
        now = time.monotonic()
        with self._lock:
            held = self._records.get("lease:" + key)
            if held is not None and held[1] >= now and held[0] != holder:
                return False
            self._records["lease:" + key] = (holder, now + ttl / 1000)
            return True
