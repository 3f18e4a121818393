"""``MemoryRecordStore``: job records in this process's memory (``StubBroker``, tests).

Memory is per process: another process cannot read a record, so worker crashes go
undetected (docs/getting-started/dramatiq-redis.md).
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Mapping
from typing import Any

from dramatiq_ext._store_protocol import DEFAULT_RECORD_TTL
from ojs_adapters.runtime.claims import AdmissionReply, claim_of
from ojs_adapters.runtime.handoff import Claim, is_newer, record_rank


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
        with self._lock:
            held = self._take_claim(key, token, ttl, time.monotonic())
        return "new" if held is None else claim_of(held, token)

    def lease(self, key: str, holder: str, ttl: int) -> bool:
        """See ``leases.lease``; leases live beside the records."""
        with self._lock:
            return self._take_lease(key, holder, ttl, time.monotonic())

    def begin(self, key: str, token: str, ttl: int, message_id: str,
              started: Mapping[str, Any] | None, *, lease_ms: int | None = None,
              attempt: int | None = None, rounds: tuple[int, int] = (0, 0)) -> AdmissionReply:
        """A delivery's whole admission under one lock, as ``RedisRecordStore.begin`` does
        it in one script: the lease (if ``lease_ms``), the claim, the record read, and
        ``started`` written over no record, or with ``attempt`` (in ``rounds``) over one
        that ranks below it."""
        text = None if started is None else json.dumps(started, separators=(",", ":"))
        wrote = False
        with self._lock:
            now = time.monotonic()
            if lease_ms is not None and not self._take_lease(key, token, lease_ms, now):
                return AdmissionReply("other", None, False, False)
            held = self._take_claim(key, token, ttl, now)
            record = self._live(message_id, now)
            if held is None and text is not None and (
                    record is None or (attempt is not None and
                                       _rank(record) < (*rounds, attempt))):
                self._records[message_id] = (text, now + self.ttl / 1000)
                wrote = True
        leased = None if lease_ms is None else True
        if held == token and text and record == text:  # this delivery's own start
            return AdmissionReply("new", None, True, leased)
        claim: Claim = "new" if held is None else claim_of(held, token)
        return AdmissionReply(claim, record, wrote, leased)

    # -- under the lock ----------------------------------------------------------------

    def _live(self, key: str, now: float) -> str | None:
        found = self._records.get(key)
        return found[0] if found is not None and found[1] >= now else None

    def _take_claim(self, key: str, token: str, ttl: int, now: float) -> str | None:
        """The live claim on ``key``, else ``None`` and ``token`` takes it for ``ttl`` ms."""
        held = self._live("claim:" + key, now)
        if held is None:
            self._records["claim:" + key] = (token, now + ttl / 1000)
        return held

    def _take_lease(self, key: str, holder: str, ttl: int, now: float) -> bool:
        """Whether ``holder`` holds the lease on ``key`` now (taken or renewed for ``ttl``
        ms); ``False`` while another holder's is live."""
        held = self._live("lease:" + key, now)
        if held is not None and held != holder:
            return False
        self._records["lease:" + key] = (holder, now + ttl / 1000)
        return True


def _rank(text: str) -> tuple[float, ...]:
    """The rank of a stored record's JSON as the admission script reads it: its rounds
    (``record_rank``) and attempt (Lua's ``tonumber``: a number or a numeric string); one
    of no readable attempt ranks above all, so a later attempt's start is never written
    over it."""
    try:
        data = json.loads(text)
        seen = data.get("attempt")
        if isinstance(seen, bool) or not isinstance(seen, (int, float, str)):
            return (math.inf,)
        attempt = float(seen)
        if math.isnan(attempt):  # compares false in Lua: never written over either
            return (math.inf,)
        replaced, replays, _ = record_rank(data)
        return replaced, replays, attempt
    except (ValueError, AttributeError, RecursionError):
        return (math.inf,)
