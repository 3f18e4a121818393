"""What ``decide()`` gets from a Celery delivery, and how a terminal decision ends it.

The policy (a header policy that fails validation is ignored, logged), the jitter
sample, a handler's ``self.retry(...)`` as a RETRY failure, and what killed a lost
attempt (a hard time limit ``OjsRequest`` marked, or a lost worker: RET-12).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from datetime import datetime
from typing import Any, NoReturn

from celery.exceptions import Ignore, SoftTimeLimitExceeded, TimeLimitExceeded

from celery_ext._conf import setting
from celery_ext._headers import HeaderState
from celery_ext.exceptions import JobDeadLettered, JobDiscarded
from ojs_adapters import JobRecord, OjsValidationError, RetryPolicy
from ojs_adapters.failure import Failure, describe_failure, requested_retry

logger = logging.getLogger("celery_ext")

#: App setting: a zero-argument callable returning the jitter sample u in [0, 1).
JITTER_SETTING = "ojs_jitter_source"


class RetryRequested(Exception):
    """Raised by ``OjsTask.retry``: the handler asks for a retry; the policy decides
    (``_self_retry``: ``max_attempts`` this failure's budget, ``next_call`` new arguments,
    ``note`` the message of ``exc="..."``, a string Celery's ``Retry`` takes as its text)."""

    def __init__(self, exc: BaseException | None, countdown: float | None, *,
                 max_attempts: int | None = None,
                 next_call: dict[str, Any] | None = None, note: str | None = None) -> None:
        super().__init__(exc, countdown)
        self.exc = exc
        self.countdown = countdown
        self.max_attempts = max_attempts
        self.next_call = next_call
        self.note = note


def header_policy(task: Any, state: HeaderState) -> RetryPolicy:
    """The policy for this delivery; a header policy that fails validation is ignored."""
    if state.ignored:
        logger.warning("%s[%s]: ignoring malformed ojs header fields %s", task.name,
                       task.request.id, ", ".join(state.ignored))
    try:
        return task.policy(state.policy)  # type: ignore[no-any-return]
    except OjsValidationError as exc:
        logger.warning("%s[%s]: ignoring the invalid retry policy in the ojs header: %s",
                       task.name, task.request.id, exc.message[:300])
        return task.policy()  # type: ignore[no-any-return]


def requested_failure(request: RetryRequested) -> Failure:
    """``self.retry(exc=..., countdown=...)``: a RETRY failure; ``countdown`` a minimum delay."""
    failure = requested_retry(request.exc, request.countdown)
    if isinstance(request.exc, (SoftTimeLimitExceeded, TimeLimitExceeded)):
        # ``except SoftTimeLimitExceeded: raise self.retry()``: the attempt timed out, as
        # when the body lets it go (``_attempt``), the retry asked for
        failure = failure._replace(catalog_code="HANDLER_TIMEOUT")
    return failure if request.note is None else failure._replace(message=request.note)


def lost_failure(record: JobRecord, attempt: int) -> Failure:
    """What killed the previous delivery of ``attempt``: a hard time limit, or a lost worker."""
    lost = record.extra.get("lost")
    if isinstance(lost, dict) and lost.get("attempt") == attempt:
        timeout = TimeLimitExceeded(lost.get("timeout"))
        failure = describe_failure(timeout, catalog_code="HANDLER_TIMEOUT")
        return failure._replace(message=str(lost.get("message") or failure.message))
    return Failure.worker_lost()


def terminal_error(task: Any, record: JobRecord,
                   exc: BaseException | None) -> JobDeadLettered | JobDiscarded:
    """What ends a job the policy ended, as ``raise terminal_error(...) from exc`` would
    chain it; raised by the caller nearest the tracer (each frame between costs Celery's
    ``ExceptionInfo`` a code-position walk and a formatted line)."""
    klass = JobDeadLettered if record.dead_lettered else JobDiscarded
    last = record.errors[-1] if record.errors else None
    reason = f": {last.type}: {last.message}" if last else ""
    message = f"{task.name}[{record.id}] {record.outcome} after attempt {record.attempt}{reason}"
    error = klass(message, record.to_dict())
    error.__cause__, error.__suppress_context__ = exc, True
    return error


class RedoneDeadLetter(JobDeadLettered, Ignore):  # type: ignore[misc]  # Ignore: untyped
    """A dead letter published again by a redelivered original (the broker refused it the
    first time). Celery stored the FAILURE and ran the errbacks, ``on_failure`` and a chord's
    count then; as an ``Ignore`` it ends this delivery with none of them again, and
    ``OjsRequest`` publishes the dead letter as for any ``JobDeadLettered``."""


def raise_terminal(task: Any, record: JobRecord, exc: BaseException | None) -> NoReturn:
    """Raise ``terminal_error``."""
    raise terminal_error(task, record, exc)


def task_jitter_sample(task: Any) -> float:
    """u in [0, 1) from the task's ``jitter_source``, the app's, or ``random.random``."""
    source: Callable[[], float] | None = getattr(type(task), "jitter_source", None)
    if source is None:
        source = setting(task.app, JITTER_SETTING) or random.random
    return float(source())


def epoch(iso: str | None) -> float | None:
    """POSIX time of an ISO 8601 UTC stamp as the core writes them."""
    if not iso:
        return None
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
