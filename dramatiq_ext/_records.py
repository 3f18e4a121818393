"""A delivery's job record on Dramatiq: read, saved, or built from what its message carries."""

from __future__ import annotations

import logging
from typing import Any

from dramatiq.common import q_name

from dramatiq_ext._options import KEY_OPTION
from dramatiq_ext._state import MessageState
from ojs_adapters import JobRecord, RetryPolicy
from ojs_adapters.keys import read_idempotency_key
from ojs_adapters.runtime.backend_retry import BackendRetry, count_failure


class Records:
    """The record calls of the hooks, retried in place; a failure is logged and counted,
    never failing the job (the record is an aid: the message carries the truth)."""

    def __init__(self, store: Any, backend_retry: BackendRetry, logger: logging.Logger) -> None:
        self.store, self.retry, self.logger = store, backend_retry, logger

    def load(self, message_id: str) -> JobRecord | None:
        """The stored record; ``None`` if there is none or it cannot be read."""
        try:
            data = self.retry.call(lambda: self.store.load(message_id),
                                   operation="read job record")
        except Exception:
            count_failure("read job record", "failed")
            self.logger.exception("Could not read the job record of %r.", message_id)
            return None
        return JobRecord.from_dict(data) if data else None

    def save(self, record: JobRecord) -> bool:
        """Store ``record``; ``False`` (logged and counted) if even the retries failed."""
        data = record.to_dict()
        try:
            self.retry.call(lambda: self.store.save(record.id, data),
                            operation="write job record")
        except Exception:
            count_failure("write job record", "failed")
            self.logger.exception("Could not save the job record of %r.", record.id)
            return False
        return True


def new_record(message: Any, policy: RetryPolicy, state: MessageState) -> JobRecord:
    """A record from what the message carries (no record yet, the store is down, or the
    message carries the whole record: ``MessageState.countdowns``)."""
    extra: dict[str, Any] = {"idempotency_key": key_of(message)}
    if state.countdowns is not None and state.delays_ms is not None:
        extra.update(countdowns=list(state.countdowns), delays_ms=list(state.delays_ms))
    if state.replay_count:  # as ``ojs_adapters.runtime.dlq.replayed_record`` stamped it
        extra.update(replay_count=state.replay_count, last_replayed_at=state.last_replayed_at)
    return JobRecord(id=message.message_id, type=message.actor_name,
                     queue=q_name(message.queue_name), max_attempts=policy.max_attempts,
                     errors=state.errors, extra=extra)


def key_of(message: Any) -> str:
    """The message's idempotency key; the message id for one sent without ``OjsRetries``."""
    return read_idempotency_key(message.options.get(KEY_OPTION)) or message.message_id
