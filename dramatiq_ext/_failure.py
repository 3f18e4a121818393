"""What ``decide`` is told about an exception a Dramatiq actor raised."""

from __future__ import annotations

from typing import Any

from dramatiq.broker import Broker, MessageProxy
from dramatiq.errors import Retry
from dramatiq.middleware.time_limit import TimeLimitExceeded

from ojs_adapters.failure import (
    RETRY_REQUESTED_TYPE,
    Failure,
    describe_failure,
    error_type_of,
    requested_retry,
)


def failure_of(exception: BaseException, throws: Any = None) -> Failure:
    """What ``decide`` needs to know about an exception a Dramatiq actor raised.

    ``throws``: the actor's Dramatiq ``throws``. A ``Retry`` that is an instance of one
    of them is, as natively, not retried: an error like any other, matched against
    ``non_retryable_errors`` (where ``throws`` put its names).
    """
    if isinstance(exception, TimeLimitExceeded):
        return describe_failure(exception, catalog_code="HANDLER_TIMEOUT")
    if isinstance(exception, Retry) and not (throws and isinstance(exception, throws)):
        return handler_retry(exception, throws)
    return describe_failure(exception)


def throws_of(broker: Broker, message: MessageProxy) -> Any:
    """The ``throws`` of ``message``'s actor (a message cannot state its own: ``_options``)."""
    return broker.get_actor(message.actor_name).options.get("throws")


def handler_retry(exception: Retry, throws: Any = None) -> Failure:
    """``raise Retry(delay=...)``: the handler asks for a retry (handler code RETRY).

    Recorded as Celery records ``self.retry(exc=...)``: the error it was handling (``raise
    Retry(...) from exc``, or raised in ``except``), else ``ojs.retry_requested`` with the
    ``Retry``'s message if it has one (as a bare ``self.retry()``); its delay (ms) is a
    floor on the policy's (``requested_retry``). Matched against ``non_retryable_errors``
    as on Celery (section 7.2), except the entries the actor's ``throws`` put there:
    natively Dramatiq retries a ``Retry`` raised from a ``throws`` error.
    """
    cause = exception.__cause__
    if cause is None and not exception.__suppress_context__:
        cause = exception.__context__
    delay = exception.delay / 1000 if exception.delay is not None else None
    failure = requested_retry(None if cause is None or isinstance(cause, Retry) else cause,
                              delay)
    if failure.type == RETRY_REQUESTED_TYPE and exception.message:
        failure = failure._replace(message=str(exception.message))
    if not throws:
        return failure
    thrown = {error_type_of(k) for k in (throws if isinstance(throws, tuple) else (throws,))}
    return failure._replace(names=tuple(n for n in failure.names if n not in thrown))
