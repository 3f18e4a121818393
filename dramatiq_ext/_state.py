"""What a message carries between attempts: ``message.options["ojs"]``.

``{"attempt": 2, "errors": [<entry>, ...]}``, and when set ``dead_letter`` (the hop to
``.XQ``), ``replay_count`` and ``last_replayed_at`` (a replayed dead letter),
``first_attempt_at``, ``previous_delay``, and the record's ``countdowns`` and
``delays_ms``: a message holds its own history even without a record store.
``MessageState.of`` never raises: an attempt it cannot trust sets ``invalid`` (the job is
dead-lettered unrun), and other bad fields are dropped. The rules per field:
docs/reliability.md.

>>> state = MessageState.of({"ojs": {"attempt": 2, "errors": []}})
>>> (state.attempt, state.dead_letter)
(2, False)
>>> bad = MessageState.of({"ojs": {"attempt": -1, "errors": "junk"}})
>>> (bad.attempt, bad.errors, bad.invalid.details["field"])
(1, (), 'attempt')
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, NamedTuple

from ojs_adapters import ErrorEntry, JobRecord
from ojs_adapters.failure import Failure
from ojs_adapters.history import (
    MAX_DECODED_ENTRIES,
    append_entry,
    bound_message,
    decode_entries,
    read_attempt,
    short_repr,
)

#: The message option under which the adapter keeps its state.
STATE_OPTION = "ojs"


class MessageState(NamedTuple):
    """The adapter's state as read from one delivery of a message.

    ``invalid`` is set when the state is unreadable (the rules: docs/reliability.md); it
    is never written back by ``to_option``.
    """

    attempt: int
    errors: tuple[ErrorEntry, ...]
    dead_letter: bool = False
    replay_count: int = 0
    last_replayed_at: str | None = None
    invalid: Failure | None = None
    first_attempt_at: float | None = None
    previous_delay: float | None = None
    #: The record's ``countdowns`` and ``delays_ms`` so far (``None``: not carried, as
    #: in messages sent before they were): with them, the message alone makes the whole
    #: ``active`` record of a later attempt, written in the admission call.
    countdowns: tuple[float, ...] | None = None
    delays_ms: tuple[int, ...] | None = None

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> MessageState:
        """Read the state from message options (a first delivery has none). Never raises."""
        raw = options.get(STATE_OPTION) if isinstance(options, Mapping) else None
        if raw is None:
            return cls(1, ())
        if not isinstance(raw, Mapping):
            return cls(1, (), invalid=_invalid(STATE_OPTION, "must be a JSON object", raw))
        attempt = read_attempt(raw.get("attempt", 1))
        invalid = None if attempt is not None else _invalid(
            "attempt", "must be an integer in 1..2**31-1", raw.get("attempt"))
        errors = decode_entries(raw.get("errors"), MAX_DECODED_ENTRIES)
        replays = raw.get("replay_count", 0)
        replays = replays if type(replays) is int and 0 < replays <= 2**31 - 1 else 0
        replayed_at = raw.get("last_replayed_at")
        return cls(attempt or 1, errors, raw.get("dead_letter") is True, replays,
                   bound_message(replayed_at, 64) if isinstance(replayed_at, str) else None,
                   invalid, _seconds(raw.get("first_attempt_at")),
                   _seconds(raw.get("previous_delay")), _numbers(raw.get("countdowns"), float),
                   _numbers(raw.get("delays_ms"), int))

    def after(self, entry: ErrorEntry, *, keep: int) -> MessageState:
        """The state with ``entry`` appended (newest ``keep`` kept)."""
        return self._replace(errors=append_entry(self.errors, entry, keep))

    def to_option(self) -> dict[str, Any]:
        """The JSON value of ``options["ojs"]``."""
        out: dict[str, Any] = {"attempt": self.attempt,
                               "errors": [e.to_dict() for e in self.errors]}
        if self.dead_letter:
            out["dead_letter"] = True
        if self.replay_count:
            out["replay_count"] = self.replay_count
            out["last_replayed_at"] = self.last_replayed_at
        if self.first_attempt_at is not None:
            out["first_attempt_at"] = self.first_attempt_at
        if self.previous_delay is not None:
            out["previous_delay"] = self.previous_delay
        if self.countdowns is not None and self.delays_ms is not None:
            out["countdowns"] = list(self.countdowns)
            out["delays_ms"] = list(self.delays_ms)
        return out


def _seconds(value: Any) -> float | None:
    """``value`` as float seconds if it is a finite number >= 0 (not a bool), else ``None``."""
    if type(value) in (int, float) and math.isfinite(value) and value >= 0:
        return float(value)
    return None


def _numbers(value: Any, kind: type[float] | type[int]) -> Any:
    """``value`` as a tuple of finite numbers >= 0 of ``kind`` (at most
    ``MAX_DECODED_ENTRIES``), or ``None`` if it is anything else (then not carried).

    >>> _numbers([0.5, 1], float), _numbers([1, "x"], float), _numbers([250], int)
    ((0.5, 1.0), None, (250,))
    """
    if not isinstance(value, list) or len(value) > MAX_DECODED_ENTRIES:
        return None
    if kind is int:
        ok = all(type(v) is int and v >= 0 for v in value)
        return tuple(value) if ok else None
    seconds = [_seconds(v) for v in value]
    return None if any(v is None for v in seconds) else tuple(seconds)


def _invalid(name: str, rule: str, value: Any) -> Failure:
    return Failure.invalid_payload(name, rule, short_repr(value))


def to_millis(seconds: float) -> int:
    """Whole milliseconds for the broker, rounded up: a retry is never early (RET-11).

    >>> to_millis(0.25), to_millis(0.1234567)
    (250, 124)
    """
    return math.ceil(round(seconds * 1000, 6))


def with_countdown(record: JobRecord, seconds: float, millis: int) -> JobRecord:
    """``record`` with one more retry delay noted in ``extra``.

    ``countdowns`` is the policy's delay in seconds per retry, in order (what the
    conformance suite compares with ``policy.delay``); ``delays_ms`` the whole
    milliseconds handed to ``broker.enqueue``.
    """
    extra = dict(record.extra)
    extra["countdowns"] = [*extra.get("countdowns", ()), seconds]
    extra["delays_ms"] = [*extra.get("delays_ms", ()), millis]
    return replace(record, extra=extra)
