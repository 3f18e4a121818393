"""The ``retrying`` test task's steps: Celery's ``self.retry(...)`` called the ways users call it.

``retrying(step, n)`` records each run in ``CALLS[task_id]`` as ``(attempt, n)``; each
step retries on attempt 1 (or every attempt) and returns what the later attempt saw.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections import defaultdict
from typing import Any

from celery.exceptions import MaxRetriesExceededError

from celery_ext import OjsTask

#: ``(attempt, n)`` per run, per task id.
CALLS: dict[str, list[tuple[int, int]]] = defaultdict(list)
#: ``(hook, what self.retry() raised there)`` per task id (``RetryingInHooks``).
HOOKED: dict[str, list[tuple[str, str]]] = defaultdict(list)
_LOCK = threading.Lock()


def retrying(task: Any, step: str, n: int) -> str:
    """Carry out ``step`` on the current attempt of ``task``."""
    attempt = task.ojs.attempt
    with _LOCK:
        CALLS[task.request.id].append((attempt, n))
    if step == "bare":  # no exception in flight, none given
        if attempt == 1:
            raise task.retry()
        return "ok"
    if step == "args":
        if attempt == 1:
            raise task.retry(args=(step, n + 10))
        return f"n={n}"
    if step == "kwargs":
        if attempt == 1:
            raise task.retry(kwargs={"n": n + 20})
        return f"n={n}"
    if step == "args-later":  # new arguments, and a wait long enough to look at the record
        if attempt == 1:
            raise task.retry(args=(step, n + 10), countdown=1.5)
        return f"n={n}"
    if step == "args-refused-by-policy":  # the policy ends the job: no next call
        raise task.retry(exc=ValueError("permanent"), args=(step, 99))
    if step == "eta":
        if attempt == 1:
            raise task.retry(eta=dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=0.4))
        return "ok"
    if step == "eta-countdown-0":  # Celery: a zero countdown gives way to the eta
        if attempt == 1:
            raise task.retry(countdown=0, eta=dt.datetime.now(dt.timezone.utc)
                             + dt.timedelta(seconds=0.4))
        return "ok"
    if step == "max-retries":  # one retry, whatever the policy's max_attempts
        raise task.retry(exc=ValueError(f"attempt {attempt}"), max_retries=1)
    if step == "catch-max":  # Celery's documented fallback once retries are spent
        try:
            raise task.retry(max_retries=1)
        except MaxRetriesExceededError:
            return f"gave up at {attempt}"
    if step == "spent-args":  # the budget spent: Celery's error names the next call's args
        try:
            raise task.retry(args=(step, n + 1), max_retries=0)
        except MaxRetriesExceededError as spent:
            return f"{spent}|{tuple(spent.task_args)}|{spent.task_kwargs}"
    if step == "exc-message":  # Celery's Retry takes a string as its text
        if attempt == 1:
            raise task.retry(exc="the cache is cold")
        return "ok"
    if step == "exc-number":  # no exception: Celery would store 5 as the RETRY result
        raise task.retry(exc=5)
    if step == "refused":
        raise task.retry(exc=ValueError("x"), queue="elsewhere")
    raise AssertionError(f"unknown step {step!r}")


class RetryingInHooks(OjsTask):
    """Calls ``self.retry()`` from ``on_failure`` and ``after_return`` (the job's first
    argument says which), as some Celery code does; notes what it raised, lets it go."""

    def on_failure(self, exc: Any, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        if args[0] == "on_failure":
            self._retry_in("on_failure", task_id)

    def after_return(self, status: str, retval: Any, task_id: str, args: Any, kwargs: Any,
                     einfo: Any) -> None:
        if args[0] == "after_return":
            self._retry_in("after_return", task_id)

    def _retry_in(self, hook: str, task_id: str) -> None:
        try:
            self.retry(countdown=0.1)
        except Exception as raised:
            with _LOCK:
                HOOKED[task_id].append((hook, type(raised).__name__))
            raise


def hooked(task: Any, step: str) -> str:
    """The body of a ``RetryingInHooks`` task: fails when ``on_failure`` is to retry."""
    with _LOCK:
        CALLS[task.request.id].append((task.ojs.attempt, 0))
    if step == "on_failure":
        raise ValueError("permanent")
    return "ok"
