"""The ``on_dead_letter`` hook on Celery: called once the dead letter's publish was confirmed.

``OjsRequest`` (the worker's main process) calls ``dead_lettered`` right after
``publish_dead_letter`` returned, so the hook sees jobs that are on the
dead-letter queue, not jobs about to be (``ojs_adapters.runtime.alerts``).
"""

from __future__ import annotations

from ojs_adapters.history import JobRecord, utc_now
from ojs_adapters.runtime.alerts import (
    DEAD_LETTER_HOOKS_REGISTRY,
    DeadLetterEvent,
    notify_dead_letter,
)
from ojs_adapters.runtime.dlq import DeadLetter, last_error


def dead_lettered(record: JobRecord, queue: str) -> None:
    """Tell the installed hooks that the job of ``record`` is now on ``queue``."""
    if not DEAD_LETTER_HOOKS_REGISTRY:
        return
    error_type, error_code = last_error(record.errors)
    letter = DeadLetter(
        id=record.id, queue=record.queue, task_type=record.type, error_type=error_type,
        error_code=error_code, dead_lettered_at=utc_now(), attempt=record.attempt,
        history=record.errors, replay_count=int(record.extra.get("replay_count") or 0),
        last_replayed_at=record.extra.get("last_replayed_at"))
    key = record.extra.get("idempotency_key")
    notify_dead_letter(DeadLetterEvent("celery", letter, queue,
                                       str(key) if key is not None else None))
