"""``current_job()``: the ``JobContext`` of the attempt running on this worker thread.

``OjsRetries`` sets it as an attempt starts and clears it when the attempt ends, so
an actor can read its idempotency key (R-6), attempt and history without the
``CurrentMessage`` middleware.
"""

from __future__ import annotations

import threading

from ojs_adapters import JobContext

_local = threading.local()


def current_job() -> JobContext | None:
    """The running attempt's ``JobContext``; ``None`` outside an ``OjsRetries`` attempt."""
    context: JobContext | None = getattr(_local, "job", None)
    return context


def set_current_job(context: JobContext) -> None:
    """Make ``context`` this thread's running attempt (``OjsRetries`` only)."""
    _local.job = context


def clear_current_job() -> None:
    """This thread runs no attempt any more."""
    _local.job = None
