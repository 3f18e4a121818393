"""Error history entries and the job record (ojs-retry.md section 10; ojs-errors.md section 6).

Entries carry ``attempt``, ``code``, ``type``, ``message`` and ``occurred_at``
(ERR-012), plus ``handler_code``, ``details`` and ``replay_round`` when present;
``timestamp`` repeats ``occurred_at`` for readers of ojs-retry section 10.1. A record keeps
at least the 10 newest entries (RET-15, ERR-011).

>>> entry = ErrorEntry(attempt=1, code="HANDLER_ERROR", type="ValueError", message="bad",
...                    occurred_at="2026-02-15T10:30:00.000Z")
>>> entry.to_dict()["timestamp"]
'2026-02-15T10:30:00.000Z'
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Literal, NamedTuple

# the clock's stamps live in ``clock``; importable from here as they always were
from ojs_adapters.clock import iso_from_epoch as iso_from_epoch
from ojs_adapters.clock import iso_utc as iso_utc
from ojs_adapters.clock import utc_now as utc_now

#: Entries a record keeps by default, and the least it may be told to keep (RET-15).
MIN_HISTORY = 10
#: Longest message kept in an entry, in characters; longer ones are cut with a marker.
MAX_MESSAGE_CHARS = 2048
#: Longest JSON text of ``details`` kept; larger details are replaced by a short repr.
MAX_DETAILS_CHARS = 8192
#: Longest ``type``, ``code``, ``occurred_at`` or ``handler_code`` read back from a message.
MAX_NAME_CHARS = 256
#: Highest attempt number a message may carry (a signed 32-bit int, as other OJS runtimes hold).
MAX_ATTEMPT = 2**31 - 1
#: Most entries read from a message or record: a bound against hostile input, above any
#: sensible retention (the retention itself is ``keep`` in ``append_entry``).
MAX_DECODED_ENTRIES = 1000

#: States of a job as the adapters record them (DESIGN.md).
JobState = Literal["active", "retryable", "completed", "discarded"]
#: How a job ended.
Outcome = Literal["completed", "discarded", "dead_letter", "failed"]


def _stamp(now: datetime | None) -> str:
    """``iso_utc(now)``; the clock's time through ``iso_from_epoch`` (a third of the cost)."""
    return iso_utc(now) if now is not None else iso_from_epoch(time.time())


def bound_message(message: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``message`` cut to ``limit`` characters, marking how much was dropped."""
    if len(message) <= limit:
        return message
    dropped = len(message) - limit
    return f"{message[:limit]}... [truncated {dropped} chars]"


def safe_details(details: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``details`` if it is a JSON object of bounded size, else ``{"repr": ...}``."""
    if not details:
        return None
    try:
        text = json.dumps(dict(details), allow_nan=False)
    except (TypeError, ValueError):
        return {"repr": bound_message(repr(details), 1024)}
    if len(text) > MAX_DETAILS_CHARS:
        return {"repr": bound_message(text, 1024)}
    return dict(details)


class ErrorEntry(NamedTuple):
    """One failed attempt in a job's error history (immutable; a NamedTuple for speed).

    ``replay_round``: the round of a replayed job the attempt ran in (0: before the first
    replay), stamped when a dead-letter replay closes that round; ``None`` on the entries
    of the round still running (the job's ``replay_count`` is theirs). Attempt numbers
    start again at 1 in each round.
    """

    attempt: int
    code: str
    type: str
    message: str
    occurred_at: str
    handler_code: str | None = None
    details: Mapping[str, Any] | None = None
    replay_round: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON: the ERR-012 fields, ``timestamp``, and the optional ones present."""
        out: dict[str, Any] = {
            "attempt": self.attempt,
            "code": self.code,
            "type": self.type,
            "message": self.message,
            "occurred_at": self.occurred_at,
            "timestamp": self.occurred_at,
        }
        if self.handler_code:
            out["handler_code"] = self.handler_code
        if self.details:
            out["details"] = dict(self.details)
        if self.replay_round is not None:
            out["replay_round"] = self.replay_round
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ErrorEntry:
        """Rebuild an entry from ``to_dict`` output, bounding what it holds."""
        details = data.get("details")
        handler_code = data.get("handler_code")
        return cls(
            attempt=int(data["attempt"]),
            code=_name(data["code"]),
            type=_name(data.get("type", "")),
            message=bound_message(str(data.get("message", ""))),
            occurred_at=_name(data.get("occurred_at") or data.get("timestamp") or ""),
            handler_code=_name(handler_code) if handler_code else None,
            details=safe_details(details) if isinstance(details, Mapping) else None,
            replay_round=_round(data.get("replay_round")),
        )


def _round(value: Any) -> int | None:
    """A readable ``replay_round`` (an int, not a bool, 0..``MAX_ATTEMPT``), else ``None``."""
    return value if type(value) is int and 0 <= value <= MAX_ATTEMPT else None


def _name(value: Any) -> str:
    return bound_message(str(value), MAX_NAME_CHARS)


def read_attempt(value: Any) -> int | None:
    """``value`` if it is a usable attempt number (an int, not a bool, 1..``MAX_ATTEMPT``).

    >>> read_attempt(2), read_attempt("2"), read_attempt(True), read_attempt(0)
    (2, None, None, None)
    """
    return value if type(value) is int and 1 <= value <= MAX_ATTEMPT else None


def short_repr(value: Any, limit: int = 200) -> str:
    """A repr of wire data for a log or an error entry, cut to about ``limit`` characters."""
    try:
        text = repr(value)
    except RecursionError:
        text = f"<{type(value).__name__} nested too deep>"
    return bound_message(text, limit)


def decode_entries(raw: Any, keep: int = MAX_DECODED_ENTRIES) -> tuple[ErrorEntry, ...]:
    """The entries of a history read from a message: the ``keep`` newest, unreadable ones dropped.

    Never raises: ``raw`` comes from the wire. Anything but a list gives ``()``; only
    the newest ``keep`` items are looked at (a 100,000-entry history costs nothing
    more); an item that is not an object or lacks a readable ``attempt`` and
    ``code`` is dropped; long strings are cut (``MAX_MESSAGE_CHARS``,
    ``MAX_NAME_CHARS``).

    >>> [e.attempt for e in decode_entries([{"attempt": 1, "code": "X"}, "junk", {}])]
    [1]
    """
    if not isinstance(raw, (list, tuple)):
        return ()
    out = []
    for item in raw[-max(keep, 1):]:
        if not isinstance(item, Mapping):
            continue
        try:
            out.append(ErrorEntry.from_dict(item))
        except (KeyError, TypeError, ValueError, OverflowError, RecursionError):
            continue
    return tuple(out)


def append_entry(errors: tuple[ErrorEntry, ...], entry: ErrorEntry,
                 keep: int = MIN_HISTORY) -> tuple[ErrorEntry, ...]:
    """``errors`` plus ``entry``, newest last, trimmed to the ``keep`` newest (>= 10)."""
    keep = max(keep, MIN_HISTORY)
    combined = (*errors, entry)
    return combined[-keep:]


@dataclass(frozen=True, slots=True)
class JobRecord:
    """What the adapters store about a job across its attempts (DESIGN.md "Job record").

    Transitions are pure: ``started``, ``failed``, ``completed`` return a new record.
    """

    id: str
    type: str
    queue: str
    max_attempts: int
    state: JobState = "active"
    attempt: int = 0
    errors: tuple[ErrorEntry, ...] = ()
    next_retry_at: str | None = None
    dead_lettered: bool = False
    outcome: Outcome | None = None
    updated_at: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def started(self, attempt: int, *, now: datetime | None = None) -> JobRecord:
        """The record as attempt ``attempt`` begins (a replayed job's old end reason goes)."""
        extra = self.extra
        if "end_reason" in extra:
            extra = {k: v for k, v in extra.items() if k != "end_reason"}
        return replace(self, state="active", attempt=attempt, next_retry_at=None,
                       updated_at=_stamp(now), extra=extra)

    def failed(self, entry: ErrorEntry, *, action: str, delay: float | None = None,
               keep: int = MIN_HISTORY, reason: str | None = None) -> JobRecord:
        """The record after a failed attempt and the decision taken on it.

        ``reason`` (the decision's, e.g. ``max_duration`` or ``budget``) is kept in
        ``extra["end_reason"]`` when the job ends, so an operator sees why.
        """
        errors = append_entry(self.errors, entry, keep)
        stamp = entry.occurred_at
        if action == "retry":
            moment = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
            next_at = iso_utc(moment + timedelta(seconds=delay or 0.0))
            return replace(self, state="retryable", attempt=entry.attempt, errors=errors,
                           next_retry_at=next_at, updated_at=stamp)
        outcome: Outcome = {"discard": "discarded", "fail": "failed",
                            "dead_letter": "dead_letter"}[action]  # type: ignore[assignment]
        extra = {**self.extra, "end_reason": reason} if reason else self.extra
        return replace(self, state="discarded", attempt=entry.attempt, errors=errors,
                       next_retry_at=None, dead_lettered=action == "dead_letter",
                       outcome=outcome, updated_at=stamp, extra=extra)

    def completed(self, *, now: datetime | None = None) -> JobRecord:
        """The record after a successful attempt; earlier errors are kept."""
        return replace(self, state="completed", next_retry_at=None, outcome="completed",
                       updated_at=_stamp(now))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON for a result backend or a log."""
        out: dict[str, Any] = {
            "id": self.id,
            "type": self.type,
            "queue": self.queue,
            "state": self.state,
            "attempt": self.attempt,
            "max_attempts": self.max_attempts,
            "errors": [e.to_dict() for e in self.errors],
            "next_retry_at": self.next_retry_at,
            "dead_lettered": self.dead_lettered,
            "outcome": self.outcome,
            "updated_at": self.updated_at,
        }
        out.update(self.extra)
        return out

    def to_json(self) -> str:
        """``to_dict`` as compact JSON text."""
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobRecord:
        """Rebuild a record from ``to_dict`` output; unknown keys go to ``extra``."""
        known = {"id", "type", "queue", "state", "attempt", "max_attempts", "errors",
                 "next_retry_at", "dead_lettered", "outcome", "updated_at"}
        return cls(
            id=str(data["id"]),
            type=str(data.get("type", "")),
            queue=str(data.get("queue", "")),
            max_attempts=int(data.get("max_attempts", 0)),
            state=data.get("state", "active"),
            attempt=int(data.get("attempt", 0)),
            errors=tuple(ErrorEntry.from_dict(e) for e in data.get("errors", ())),
            next_retry_at=data.get("next_retry_at"),
            dead_lettered=bool(data.get("dead_lettered", False)),
            outcome=data.get("outcome"),
            updated_at=data.get("updated_at"),
            extra={k: v for k, v in data.items() if k not in known},
        )
