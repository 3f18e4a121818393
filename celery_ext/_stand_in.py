"""The exception a retry carries when no exception object is at hand: a lost attempt's
cause, or the failure of a retry sent again from the job record (its first send may not
have reached the broker, or it came back from parking).

Celery stores it with the RETRY state and hands it to ``on_retry``/``task_retry``, and it
is the dead letter's cause should the resend fail for good. It is the recorded failure's
own class when that class is already imported (never importing anything a record names),
else a ``JobError`` of the recorded type: never a ``WorkerLostError`` for an attempt that
failed with an ordinary exception. A bare ``self.retry()`` had none: ``None``, as in Celery.
"""

from __future__ import annotations

import sys

from billiard.exceptions import WorkerLostError
from celery.exceptions import TimeLimitExceeded

from ojs_adapters import ErrorEntry, JobError
from ojs_adapters.catalog import HANDLER_CODES
from ojs_adapters.failure import RETRY_REQUESTED_TYPE, error_type_of, requested_retry

#: The message of a request entry with no text of its own (a bare ``self.retry()``).
REQUESTED_MESSAGE = requested_retry(None, None).message


def stand_in(entry: ErrorEntry) -> BaseException | None:
    """An exception for the failure ``entry`` records; ``None`` for a bare ``self.retry()``
    (Celery's own ``Retry.exc`` then)."""
    if entry.type == RETRY_REQUESTED_TYPE:
        return None
    if entry.code == "HANDLER_TIMEOUT":
        timeout: BaseException = TimeLimitExceeded(entry.message)
        return timeout
    if entry.code == "HANDLER_PANIC":
        lost: BaseException = WorkerLostError(entry.message)
        return lost
    klass = _loaded_class(entry.type)
    if klass is not None:
        try:
            return klass(entry.message)
        except Exception:  # a constructor that wants other arguments
            pass
    code = entry.handler_code if entry.handler_code in HANDLER_CODES else None
    return JobError(entry.type or "ojs.unknown", entry.message, code=code)  # type: ignore[arg-type]


def retry_text(entry: ErrorEntry) -> str | None:
    """The text of ``self.retry(exc="...")`` for Celery's ``Retry`` (its log line, the
    ``task_retry`` reason), read back from the request's entry; ``None`` for any other."""
    if entry.type == RETRY_REQUESTED_TYPE and entry.message != REQUESTED_MESSAGE:
        return entry.message
    return None


def _loaded_class(name: str) -> type[Exception] | None:
    """The exception class an error type names, if its module is already imported and its
    type is that name (``module.QualName``, ``builtins.`` dropped)."""
    module, _, qualname = name.rpartition(".")
    while True:
        found = _lookup(module or "builtins", qualname)
        if found is not None:
            return found
        if not module:
            return None
        module, _, head = module.rpartition(".")
        qualname = f"{head}.{qualname}"


def _lookup(module: str, qualname: str) -> type[Exception] | None:
    value: object = sys.modules.get(module)
    for part in qualname.split("."):
        value = getattr(value, part, None) if value is not None else None
    if isinstance(value, type) and issubclass(value, Exception) \
            and error_type_of(value) == (qualname if module == "builtins" else
                                         f"{module}.{qualname}"):
        return value
    return None
