"""A dead letter Celery could not store the FAILURE of still goes to its queue.

When the result backend fails as Celery stores a task's FAILURE, Celery reports an
"internal error": the main process gets the backend's exception, not the
``JobDeadLettered`` the attempt ended with, and acks the message, so the dead letter
would never be published (the job lost). In the pool child, where the backend's
exception still has the ``JobDeadLettered`` as its ``__context__``, this names it on the
exception (pickled with it to the main process), and ``OjsRequest`` dead-letters as usual.
"""

from __future__ import annotations

import contextlib
from typing import Any

from celery import signals

from celery_ext.exceptions import JobDeadLettered

#: Attribute of an internal error's exception naming the dead letter it cut short.
DEAD_LETTER_ATTRIBUTE = "ojs_dead_letter"


def dead_letter_of(exc: BaseException) -> JobDeadLettered | None:
    """The ``JobDeadLettered`` an internal error ``exc`` cut short (see the module)."""
    found = getattr(exc, DEAD_LETTER_ATTRIBUTE, None)
    return found if isinstance(found, JobDeadLettered) else None


def _name_the_dead_letter(sender: Any = None, exception: BaseException | None = None,
                          **_: Any) -> None:
    cause, seen = exception, set()
    while cause is not None and id(cause) not in seen:  # through each retry's own error
        seen.add(id(cause))
        cause = cause.__context__  # the exception being handled when it was raised
        if isinstance(cause, JobDeadLettered) and exception is not None:
            with contextlib.suppress(AttributeError, TypeError):  # none: acked, as by Celery
                setattr(exception, DEAD_LETTER_ATTRIBUTE, cause)
            return


signals.task_internal_error.connect(_name_the_dead_letter, weak=False)
