"""The OJS state a Celery message carries between attempts, in one header.

Celery keeps nothing about a job between attempts but the message, so the attempt, the
error history and the countdowns travel in the header ``ojs`` (JSON text: exact floats,
the same bytes on every transport). ``Task.retry(headers=...)`` replaces the headers
wholesale, so a retry merges its state into the request's own (``merged``).
``from_headers`` never raises: an attempt it cannot trust sets ``invalid`` (the job is
dead-lettered unrun), and other bad fields are dropped and named in ``ignored``. The rules
per field: docs/reliability.md.

>>> state = HeaderState.from_headers({})
>>> (state.attempt, state.errors, state.policy)
(1, (), None)
>>> HeaderState.from_headers({"ojs": HeaderState(attempt=2).encode()}).attempt
2
>>> bad = HeaderState.from_headers({"ojs": '{"attempt": "2", "countdowns": "x"}'})
>>> (bad.attempt, bad.invalid.details["field"], bad.ignored)
(1, 'attempt', ('countdowns',))
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ojs_adapters import ErrorEntry
from ojs_adapters.failure import Failure
from ojs_adapters.history import (
    MAX_DECODED_ENTRIES,
    MIN_HISTORY,
    decode_entries,
    read_attempt,
    short_repr,
)
from ojs_adapters.keys import read_idempotency_key

#: Name of the message header that carries the OJS state.
HEADER = "ojs"
#: Headers a transport adds on redelivery or dead-lettering; never copied into a retry (a
#: kept ``x-death`` makes RabbitMQ drop a retry parked twice as a dead-letter cycle).
_TRANSPORT_HEADERS = frozenset({"redelivered", "x-death", "x-first-death-exchange",
                                "x-first-death-queue", "x-first-death-reason",
                                "x-last-death-exchange", "x-last-death-queue",
                                "x-last-death-reason"})


@dataclass(frozen=True)
class HeaderState:
    """What one delivery knows about its job: which attempt it is and what went before.

    ``policy`` is the full effective policy when the caller overrode it
    (``apply_async(retry_policy=...)``); ``not_before`` is the POSIX time
    before which this attempt must not start (RET-11); ``first_attempt_at``
    when attempt 1 started (for the ``max_duration`` extension);
    ``idempotency_key`` the job's key (R-6), set at first send. ``invalid`` and
    ``ignored`` say what ``from_headers`` refused (the rules: docs/reliability.md); neither
    is encoded.
    """

    attempt: int = 1
    errors: tuple[ErrorEntry, ...] = ()
    countdowns: tuple[float, ...] = ()
    jitter_samples: tuple[float | None, ...] = ()
    policy: Mapping[str, Any] | None = None
    not_before: float | None = None
    first_attempt_at: float | None = None
    idempotency_key: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    invalid: Failure | None = field(default=None, compare=False)
    ignored: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def from_headers(cls, headers: Mapping[str, Any] | None) -> HeaderState:
        """Read the state from a request's headers; a first delivery has none. Never raises."""
        raw = headers.get(HEADER) if isinstance(headers, Mapping) else None
        if raw is None:
            return cls()
        try:
            data = json.loads(raw) if isinstance(raw, (str, bytes, bytearray)) else raw
        except (ValueError, RecursionError) as exc:  # ValueError: bad JSON or a huge int
            return cls(invalid=_invalid(HEADER, f"not JSON ({type(exc).__name__})", raw))
        if not isinstance(data, Mapping):
            return cls(invalid=_invalid(HEADER, "must be a JSON object", data))
        ignored: list[str] = []
        attempt = read_attempt(data.get("attempt", 1))
        invalid = None
        if attempt is None:
            invalid = _invalid("attempt", "must be an integer in 1..2**31-1",
                               data.get("attempt"))
        countdowns = _numbers(data, "countdowns", ignored, unit=False)
        samples = _numbers(data, "jitter_samples", ignored, unit=True)
        key = data.get("idempotency_key")
        if key is not None and read_idempotency_key(key) is None:
            ignored.append("idempotency_key")
            key = None
        policy = data.get("policy")
        if policy is not None and not isinstance(policy, Mapping):
            ignored.append("policy")
            policy = None
        return cls(
            attempt=attempt or 1,
            errors=decode_entries(data.get("errors"), MIN_HISTORY),
            countdowns=countdowns,  # type: ignore[arg-type]  # no None unless unit
            jitter_samples=samples,
            policy=policy,
            not_before=_moment(data, "not_before", ignored),
            first_attempt_at=_moment(data, "first_attempt_at", ignored),
            idempotency_key=key,
            invalid=invalid,
            ignored=tuple(ignored),
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data."""
        out: dict[str, Any] = {
            "attempt": self.attempt,
            "errors": [e.to_dict() for e in self.errors],
            "countdowns": list(self.countdowns),
            "jitter_samples": list(self.jitter_samples),
        }
        if self.policy is not None:
            out["policy"] = dict(self.policy)
        for name in ("not_before", "first_attempt_at", "idempotency_key"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        out.update(self.extra)
        return out

    def encode(self) -> str:
        """The header value: compact JSON text."""
        return json.dumps(self.to_dict(), separators=(",", ":"))


def _invalid(name: str, rule: str, value: Any) -> Failure:
    return Failure.invalid_payload(name, rule, short_repr(value))


def _finite(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def _moment(data: Mapping[str, Any], name: str, ignored: list[str]) -> float | None:
    value = data.get(name)
    if value is None:
        return None
    if _finite(value):
        return float(value)
    ignored.append(name)
    return None


def _numbers(data: Mapping[str, Any], name: str, ignored: list[str],
             *, unit: bool) -> tuple[float | None, ...]:
    """The newest numbers of list ``name``: finite >= 0 (``unit``: in [0, 1) or null)."""
    items = data.get(name, ())
    if not isinstance(items, (list, tuple)):
        ignored.append(name)
        return ()
    items = items[-MAX_DECODED_ENTRIES:]
    ok = all((unit and v is None) or (_finite(v) and v >= 0 and (not unit or v < 1))
             for v in items)
    if not ok:
        ignored.append(name)
        return ()
    return tuple(None if v is None else float(v) for v in items)


def merged(headers: Mapping[str, Any] | None, **updates: Any) -> dict[str, Any]:
    """``headers`` minus transport markers, with ``updates`` on top (for ``retry(headers=)``)."""
    out = {k: v for k, v in (headers or {}).items() if k not in _TRANSPORT_HEADERS}
    out.update(updates)
    return out
