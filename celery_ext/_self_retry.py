"""``OjsTask.retry(...)``: Celery's arguments read as a handler's RETRY request to the policy.

- ``exc`` (else the exception in flight) is the failure recorded; with neither, the entry is
  ``ojs.retry_requested``: no exception type is made up. A string ``exc`` is that entry's
  message (Celery's ``Retry`` takes one as its text); any other non-exception is refused.
- ``countdown`` / ``eta``: the least delay before the next attempt (handler code RETRY,
  ojs-retry.md 7.1: the policy's backoff applies, and wins when longer); as in Celery, a
  ``countdown`` other than 0 wins over an ``eta``.
- ``max_retries``: this failure's attempt budget, ``max_retries + 1`` attempts (Celery's
  count), for this call only: Celery's does not carry over to later attempts either.
- ``args`` / ``kwargs``: what the next attempt runs with (Celery's own merge, ``Task.retry``);
  kept in the job record, so a retry sent again from it carries them too.
- A spent budget raises in the body, as Celery does: ``exc`` if given, else Celery's own
  ``MaxRetriesExceededError`` (naming the next call's arguments). Caught, the body goes on;
  uncaught, the job ends per the policy.
- Anything else (``throw=False``, ``queue=``, ``priority=``...) raises ``RetryRefused``;
  uncaught, it dead-letters the job (kept, not lost). So does a call after the attempt
  ended (``on_failure``, ``after_return``), where the job ends as the policy decided.
"""

from __future__ import annotations

import json
import math
import numbers
import sys
import time
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from celery import Task
from celery.exceptions import Retry
from celery.utils.serialization import raise_with_context
from celery.utils.time import maybe_make_aware

from celery_ext._headers import HeaderState
from celery_ext._inputs import RetryRequested, requested_failure
from celery_ext.exceptions import RetryRefused
from ojs_adapters import JobRecord, OjsValidationError, RetryPolicy
from ojs_adapters.failure import Failure, describe_failure

#: Request attribute: the budget a spent ``self.retry(max_retries=...)`` raised against.
LIMIT_ATTRIBUTE = "ojs_retry_limit"
#: Record extra: the ``args``/``kwargs`` the next attempt runs with, when the body set them.
NEXT_CALL = "next_call"
_UNSET = object()


def retry_request(task: Any, args: Any, kwargs: Any, exc: Any, throw: bool,
                  eta: Any, countdown: Any, max_retries: Any,
                  options: Mapping[str, Any]) -> RetryRequested:
    """The request ``task.retry(...)`` makes; raises ``RetryRefused`` for an argument the
    policy cannot honour, and what Celery raises when the attempt budget is spent."""
    delay, limit, call = checked(task, args, kwargs, throw, eta, countdown, max_retries,
                                 options)
    note = _checked_exc(exc)
    request = task.request
    attempt = HeaderState.from_headers(request.headers).attempt
    budget = limit if limit is not None else _policy(task).max_attempts
    if attempt >= budget:  # Celery: retries + 1 > max_retries
        setattr(request, LIMIT_ATTRIBUTE, budget)
        if exc is not None:
            raise_with_context(exc)  # a message string: Celery's TypeError, as natively
        raise spent_error(task, args, kwargs)
    cause = None if note is not None else exc if exc is not None else sys.exc_info()[1]
    return RetryRequested(cause, delay, max_attempts=limit, next_call=call, note=note)


def attempt_over() -> RetryRefused:
    """What ``task.retry(...)`` raises outside its attempt (``on_failure``, ``after_return``):
    the attempt's outcome is stored and the policy has decided, so there is no failure
    left to retry; the job ends as decided, neither run again nor lost."""
    return RetryRefused("OjsTask.retry() was called after the attempt ended (in on_failure "
                        "or after_return, say): the policy has decided the job's outcome; "
                        "call it from the task body", field="retry", rule="inside the body")


def checked(task: Any, args: Any, kwargs: Any, throw: bool, eta: Any, countdown: Any,
            max_retries: Any, options: Mapping[str, Any],
            ) -> tuple[float | None, int | None, dict[str, Any] | None]:
    """``(least delay, attempt budget, next call)`` from ``task.retry``'s arguments; raises
    ``RetryRefused`` naming the first one the policy cannot honour."""
    refused = [*sorted(options), *([] if throw else ["throw"])]
    if refused:
        raise RetryRefused(
            f"OjsTask.retry() cannot honour {refused}: the OJS policy sends the retry to the "
            "same queue with the same options, and always raises",
            field=refused[0], rule="not supported on an OjsTask")
    limit = None if max_retries is None else _count(max_retries) + 1
    return _least_delay(task, eta, countdown), limit, _next_call(args, kwargs)


def body_failure(run: Any, raised: Exception) -> tuple[BaseException | Failure,
                                                       BaseException | None]:
    """``(error, cause)`` for ``decide`` from what left attempt ``run``'s body (a worker's
    ``Delivery`` or an eager job); a ``max_retries`` the body gave narrows ``run``'s budget,
    and the arguments it gave go into ``run``'s record."""
    limit = run.request.__dict__.pop(LIMIT_ATTRIBUTE, None)
    error: BaseException | Failure = raised
    cause: BaseException | None = raised
    if isinstance(raised, RetryRequested):
        limit, error, cause = raised.max_attempts, requested_failure(raised), raised.exc
        if raised.next_call is not None:
            run.base = replace(run.base, extra={**run.base.extra, NEXT_CALL: raised.next_call})
    elif isinstance(raised, RetryRefused):  # a misuse: kept for a person to look at
        error = describe_failure(raised)._replace(handler_code="DEAD_LETTER")
    if limit is not None:
        run.policy = replace(run.policy, max_attempts=limit)
        run.base = replace(run.base, max_attempts=limit)
    return error, cause


def without_call(record: JobRecord) -> JobRecord:
    """``record`` without the next call's arguments: kept only while a retry may have to be
    sent again from it, not once it is handed off or the job has ended."""
    if NEXT_CALL not in record.extra:
        return record
    return replace(record, extra={k: v for k, v in record.extra.items() if k != NEXT_CALL})


def next_call(record: JobRecord) -> dict[str, Any]:
    """``args``/``kwargs`` for ``Task.retry`` from ``record`` (empty: the request's own)."""
    call = record.extra.get(NEXT_CALL)
    if not isinstance(call, Mapping):
        return {}
    return {k: call[k] for k in ("args", "kwargs") if call.get(k) is not None}


def eager_call(task: Any, call: Mapping[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The next eager attempt's ``(args, kwargs)``: Celery's own merge of ``call`` with the
    request's, read off the ``Retry`` that ``Task.retry`` raises unsent in an eager call."""
    try:
        Task.retry(task, call.get("args"), call.get("kwargs"), countdown=0)
    except Retry as made:
        return tuple(made.sig.args), dict(made.sig.kwargs)
    raise AssertionError("Task.retry returned")  # pragma: no cover - it always raises


def spent_error(task: Any, args: Any, kwargs: Any) -> BaseException:
    """Celery's own ``MaxRetriesExceededError`` for a spent budget, made by ``Task.retry``
    (a budget it finds spent publishes nothing): its text and ``task_args``/``task_kwargs``
    name the next call's arguments, ``args``/``kwargs`` merged with the request's."""
    saved = vars(task).get("override_max_retries", _UNSET)
    try:
        Task.retry(task, args, kwargs, max_retries=-1)  # any attempt count is over -1
    except task.MaxRetriesExceededError as made:
        spent: BaseException = made.with_traceback(None)
        return spent
    finally:  # Task.retry leaves this call's max_retries on the shared task object
        if saved is _UNSET:
            vars(task).pop("override_max_retries", None)
        else:
            task.override_max_retries = saved
    raise AssertionError("Task.retry went on")  # pragma: no cover - a spent budget raises


def _checked_exc(exc: Any) -> str | None:
    """``exc``'s message when it is a string (Celery's ``Retry`` takes one as its text);
    anything else but an exception instance raises ``RetryRefused``: Celery stores such a
    value as the RETRY result, and every later read of the task's state fails."""
    if isinstance(exc, str):
        return exc
    if exc is not None and not isinstance(exc, BaseException):
        raise RetryRefused(f"OjsTask.retry(exc=...) must be an exception instance (or a "
                           f"message string), got {type(exc).__name__}", field="exc",
                           rule="exception instance")
    return None


def _least_delay(task: Any, eta: Any, countdown: Any) -> float | None:
    if countdown is not None:
        if isinstance(countdown, bool) or not isinstance(countdown, numbers.Real) \
                or not math.isfinite(countdown):
            raise RetryRefused(f"OjsTask.retry(countdown=...) must be a finite number of "
                               f"seconds, got {countdown!r}", field="countdown",
                               rule="finite number")
        if countdown or eta is None:  # Celery: a zero countdown gives way to an eta
            return max(0.0, float(countdown))  # a past moment: now, as Celery's ETA would be
    if eta is None:
        return None
    when = eta
    if isinstance(when, str):
        try:
            when = datetime.fromisoformat(when)
        except ValueError:
            when = None
    if not isinstance(when, datetime):
        raise RetryRefused(f"OjsTask.retry(eta=...) must be a datetime or an ISO 8601 "
                           f"string, got {eta!r}", field="eta", rule="datetime")
    moment = float(maybe_make_aware(when, task.app.timezone).timestamp())
    return max(0.0, moment - time.time())


def _count(max_retries: Any) -> int:
    if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
        raise RetryRefused(f"OjsTask.retry(max_retries=...) must be an integer >= 0 (None: "
                           f"the policy's), got {max_retries!r}", field="max_retries",
                           rule="integer >= 0")
    return max_retries


def _next_call(args: Any, kwargs: Any) -> dict[str, Any] | None:
    if args is None and kwargs is None:
        return None
    if args is not None and not isinstance(args, (list, tuple)):
        raise RetryRefused(f"OjsTask.retry(args=...) must be a list or tuple, got "
                           f"{type(args).__name__}", field="args", rule="list or tuple")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise RetryRefused(f"OjsTask.retry(kwargs=...) must be a mapping, got "
                           f"{type(kwargs).__name__}", field="kwargs", rule="mapping")
    call = {"args": None if args is None else list(args),
            "kwargs": None if kwargs is None else dict(kwargs)}
    try:
        json.dumps(call)
    except (TypeError, ValueError):
        field = "kwargs" if args is None else "args"
        raise RetryRefused("OjsTask.retry(args=..., kwargs=...) must be JSON-encodable: the "
                           "job record keeps them for a retry sent again", field=field,
                           rule="JSON-encodable") from None
    return call


def _policy(task: Any) -> RetryPolicy:
    """The delivery's policy: the header's, else the task's (as ``header_policy``)."""
    state = HeaderState.from_headers(task.request.headers)
    try:
        return task.policy(state.policy)  # type: ignore[no-any-return]
    except OjsValidationError:
        return task.policy()  # type: ignore[no-any-return]
