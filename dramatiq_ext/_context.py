"""``current_job()``: the ``JobContext`` of the attempt this code runs for.

``OjsRetries`` sets it as an attempt starts and clears it when the attempt ends, so
an actor can read its idempotency key (R-6), attempt and history without the
``CurrentMessage`` middleware.

A ``ContextVar``, not a thread-local: an ``async def`` actor runs on the event loop
thread of Dramatiq's ``AsyncIO`` middleware, and ``asyncio.run_coroutine_threadsafe``
runs it in a copy of the worker thread's context, taken as the worker hands it over,
so the value set in ``before_process_message`` is what the coroutine sees.
"""

from __future__ import annotations

from contextvars import ContextVar

from ojs_adapters import JobContext

#: The running attempt of this worker thread (and of the coroutine it hands to the loop).
_job: ContextVar[JobContext | None] = ContextVar("ojs_dramatiq_current_job", default=None)


def current_job() -> JobContext | None:
    """The running attempt's ``JobContext``; ``None`` outside an ``OjsRetries`` attempt.

    Works in plain and ``async def`` actors alike::

        @dramatiq.actor(retry_policy={"max_attempts": 5})
        async def charge(order_id):
            job = current_job()
            await gateway.charge(order_id, idempotency_key=job.idempotency_key)
    """
    return _job.get()


def set_current_job(context: JobContext) -> None:
    """Make ``context`` this thread's running attempt (``OjsRetries`` only)."""
    _job.set(context)


def clear_current_job() -> None:
    """This thread runs no attempt any more."""
    _job.set(None)
