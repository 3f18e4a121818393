"""A success Celery could not store ends the record as Celery ends the task: failed.

After the body returns, Celery still sends the ``link`` callbacks (a chain's next task)
and encodes the result; when that fails (a result its serializer cannot encode, a
callback it cannot send) it stores FAILURE instead, and does not retry. The attempt's
record was saved ``completed`` (with that write, or before it); ``task_postrun`` then
saves it again, ended ``failed`` with the error, so the record and ``AsyncResult`` agree.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from celery import states
from celery.signals import task_postrun

from celery_ext._result_ride import finish
from ojs_adapters.failure import describe_failure
from ojs_adapters.history import ErrorEntry, JobRecord, bound_message, iso_utc, utc_now

#: The ``completed`` record of the attempt that just ran in this thread, and how to save.
_LOCAL = threading.local()


def expect_success(task_id: str, record: JobRecord, save: Callable[[JobRecord], None]) -> None:
    """``record`` (completed) stands unless Celery ends ``task_id`` otherwise (above)."""
    _LOCAL.pending = (task_id, record, save)


def unstored_record(record: JobRecord, error: BaseException) -> JobRecord:
    """``record`` (completed) after Celery failed to store its success with ``error``."""
    failure = describe_failure(error)
    entry = ErrorEntry(attempt=record.attempt, code=failure.catalog_code, type=failure.type,
                       message=bound_message(failure.message), occurred_at=iso_utc(utc_now()))
    return record.failed(entry, action="fail", reason="the result could not be stored")


def _settle(task_id: Any = None, state: Any = None, retval: Any = None, **_: Any) -> None:
    pending, _LOCAL.pending = getattr(_LOCAL, "pending", None), None
    if pending is None or pending[0] != task_id or state != states.FAILURE:
        return
    _, record, save = pending
    finish()  # a completed record still waiting for its ride is saved first, then replaced
    error = retval if isinstance(retval, BaseException) else RuntimeError(repr(retval))
    save(unstored_record(record, error))


task_postrun.connect(_settle, weak=False)
