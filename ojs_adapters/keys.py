"""Idempotency keys (integration standard R-6): one key per logical job, kept across retries.

A job gets a UUID v4 key when it is first enqueued, unless the caller gives its
own; every retry and every dead-letter replay carries the same key, so the
handler can pass it on (an ``Idempotency-Key`` header, a dedup table).

>>> len(new_idempotency_key())
36
>>> check_idempotency_key("order-42")
'order-42'
>>> check_idempotency_key("")
Traceback (most recent call last):
...
ojs_adapters.errors.OjsValidationError: idempotency_key must be a string of 1..64 characters, got ''
"""

from __future__ import annotations

import uuid
from typing import Any

from ojs_adapters.errors import OjsValidationError

#: Longest key allowed (R-6: "Keys MUST be at most 64 characters").
MAX_KEY_CHARS = 64


def new_idempotency_key() -> str:
    """A fresh UUID v4 string (36 characters, within R-6's 64)."""
    return str(uuid.uuid4())


def check_idempotency_key(value: Any, field: str = "idempotency_key") -> str:
    """``value`` if it is a usable key (a str of 1..64 characters); else ``OjsValidationError``."""
    if type(value) is str and 0 < len(value) <= MAX_KEY_CHARS:
        return value
    shown = repr(value)[:80]
    raise OjsValidationError(
        f"{field} must be a string of 1..{MAX_KEY_CHARS} characters, got {shown}",
        code="INVALID_ARGS",
        details={"field": field, "value": shown, "rule": f"string of 1..{MAX_KEY_CHARS} chars"},
    )


def read_idempotency_key(value: Any) -> str | None:
    """``value`` if it is a usable key, else ``None`` (for data read off the wire)."""
    return value if type(value) is str and 0 < len(value) <= MAX_KEY_CHARS else None
