"""What a job-record store is (``RecordStore``) and how long it keeps records.

A leaf module so that each store (``_store_memory``, ``_store_redis``,
``_store_results``) and ``stores`` can share them without importing each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

#: How long a record is kept, in milliseconds (Dramatiq's dead-message TTL).
DEFAULT_RECORD_TTL = 7 * 86_400_000


class RecordStore(Protocol):
    """What ``OjsRetries`` needs of a job-record store: JSON objects by message id."""

    def load(self, message_id: str) -> dict[str, Any] | None:
        """The stored record, or ``None``."""

    def save(self, message_id: str, record: Mapping[str, Any]) -> None:
        """Store ``record`` (plain JSON data) for ``message_id``."""
