"""The ``on_dead_letter`` hook on Dramatiq: called as the dead-letter hop is failed into ``.XQ``.

``OjsRetries`` dead-letters a job by enqueuing a copy marked ``dead_letter`` that a
worker then fails (``message.fail()``), so Dramatiq moves it to ``<queue>.XQ`` with
its full history. ``after_skip_message`` calls ``dead_lettered`` for that copy
(``ojs_adapters.runtime.alerts``).
"""

from __future__ import annotations

from typing import Any

from dramatiq.common import q_name, xq_name

from dramatiq_ext._options import KEY_OPTION
from dramatiq_ext._state import MessageState
from ojs_adapters.history import utc_now
from ojs_adapters.runtime.alerts import (
    DEAD_LETTER_HOOKS_REGISTRY,
    DeadLetterEvent,
    notify_dead_letter,
)
from ojs_adapters.runtime.dlq import DeadLetter, last_error


def dead_lettered(message: Any, state: MessageState) -> None:
    """Tell the installed hooks that ``message`` (the failed hop) is now on its ``.XQ``."""
    if not DEAD_LETTER_HOOKS_REGISTRY:
        return
    error_type, error_code = last_error(state.errors)
    queue = q_name(message.queue_name)
    letter = DeadLetter(
        id=message.message_id, queue=queue, task_type=message.actor_name,
        error_type=error_type, error_code=error_code, dead_lettered_at=utc_now(),
        attempt=state.attempt, history=state.errors, replay_count=state.replay_count,
        last_replayed_at=state.last_replayed_at)
    key = message.options.get(KEY_OPTION)
    notify_dead_letter(DeadLetterEvent("dramatiq", letter, xq_name(queue),
                                       str(key) if key is not None else None))
