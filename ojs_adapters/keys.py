"""Idempotency keys (integration standard R-6): one UUID v4 per logical job, kept across retries.

>>> len(new_idempotency_key())
36
"""

from __future__ import annotations

import uuid


def new_idempotency_key() -> str:
    """A fresh UUID v4 string (36 characters, within R-6's 64)."""
    return str(uuid.uuid4())
