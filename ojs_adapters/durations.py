"""ISO 8601 durations for retry policies (ojs-retry.md section 4; RET-02, RET-19).

Parsing is done by ``isodate``; this module adds what isodate is lenient about:
the syntax check (``PT`` alone, a fraction on a non-final component and signs
are rejected) and the rule that years and months have no fixed length, so a
retry interval cannot use them.

>>> parse_duration("PT1.5M", field="initial_interval")
datetime.timedelta(seconds=90)
>>> format_duration(timedelta(seconds=90))
'PT1M30S'
"""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal
from typing import Any

import isodate

from ojs_adapters.errors import invalid_policy

_NUM = r"(\d+(?:[.,]\d+)?)"
#: ISO 8601 duration syntax (4.4.3.2), fractions allowed; a stricter check follows.
_SYNTAX = re.compile(
    rf"^P(?!$)(?:{_NUM}Y)?(?:{_NUM}M)?(?:{_NUM}W)?(?:{_NUM}D)?"
    rf"(?:T(?=\d)(?:{_NUM}H)?(?:{_NUM}M)?(?:{_NUM}S)?)?$"
)
_NAMES = ("years", "months", "weeks", "days", "hours", "minutes", "seconds")


def parse_duration(value: Any, *, field: str) -> timedelta:
    """Parse an ISO 8601 duration string or raise ``OjsValidationError`` naming ``field``."""
    if not isinstance(value, str):
        raise invalid_policy(field, value, "must be an ISO 8601 duration string such as 'PT1S'")
    match = _SYNTAX.match(value)
    if match is None:
        raise invalid_policy(field, value, "is not an ISO 8601 duration (PnDTnHnMnS)")
    parts = dict(zip(_NAMES, match.groups(), strict=True))
    if parts["years"] is not None or parts["months"] is not None:
        raise invalid_policy(
            field, value,
            "years and months have no fixed length; use days, hours, minutes or seconds",
        )
    present = [name for name in _NAMES if parts[name] is not None]
    if parts["weeks"] is not None and len(present) > 1:
        raise invalid_policy(field, value, "weeks (PnW) cannot be combined with other components")
    fractional = [name for name in present if any(c in str(parts[name]) for c in ".,")]
    if fractional and fractional != present[-1:]:
        raise invalid_policy(field, value, "only the smallest component may have a fraction")
    try:
        parsed = isodate.parse_duration(value)
    except (isodate.ISO8601Error, ValueError, OverflowError) as exc:
        raise invalid_policy(field, value, f"is not an ISO 8601 duration ({exc})") from None
    if not isinstance(parsed, timedelta):  # pragma: no cover - years/months rejected above
        raise invalid_policy(field, value, "must have a fixed length")
    return parsed


def format_duration(value: timedelta) -> str:
    """Format a non-negative timedelta as the shortest ``PnDTnHnMnS`` string."""
    micros = (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
    if micros < 0:
        raise ValueError("durations in a retry policy are never negative")
    days, rest = divmod(micros, 86_400 * 1_000_000)
    hours, rest = divmod(rest, 3_600 * 1_000_000)
    minutes, rest = divmod(rest, 60 * 1_000_000)
    seconds = Decimal(rest) / Decimal(1_000_000)
    out = "P" + (f"{days}D" if days else "")
    time = (f"{hours}H" if hours else "") + (f"{minutes}M" if minutes else "")
    if seconds:
        time += f"{seconds.normalize():f}S"
    if time:
        out += "T" + time
    return out if out != "P" else "PT0S"
