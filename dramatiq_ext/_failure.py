"""What ``decide`` is told about an exception a Dramatiq actor raised."""

from __future__ import annotations

from dramatiq.errors import Retry
from dramatiq.middleware.time_limit import TimeLimitExceeded

from ojs_adapters.failure import Failure, describe_failure, requested_retry


def failure_of(exception: BaseException) -> Failure:
    """What ``decide`` needs to know about an exception a Dramatiq actor raised."""
    if isinstance(exception, TimeLimitExceeded):
        return describe_failure(exception, catalog_code="HANDLER_TIMEOUT")
    if isinstance(exception, Retry):
        # The handler asks for a retry, as Celery's ``self.retry(exc=...)``: the failure is
        # what it was handling (``raise Retry(...) from exc``, or raised in ``except``),
        # with handler code RETRY and its delay (ms) as a floor (``requested_retry``).
        cause = exception.__cause__
        if cause is None and not exception.__suppress_context__:
            cause = exception.__context__
        delay = exception.delay / 1000 if exception.delay is not None else None
        return requested_retry(None if isinstance(cause, Retry) else cause, delay)
    return describe_failure(exception)
