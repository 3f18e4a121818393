"""``JobContext``: what a running handler may know about its job, the same in both frameworks.

Celery handlers read it as ``self.ojs`` (``bind=True``); Dramatiq actors call
``dramatiq_ext.current_job()``. It never holds the job's arguments.

>>> ctx = JobContext(job_id="j1", attempt=2, idempotency_key="k1", errors=())
>>> (ctx.attempt, ctx.is_retry)
(2, True)
"""

from __future__ import annotations

from typing import NamedTuple

from ojs_adapters.history import ErrorEntry


class JobContext(NamedTuple):
    """The running attempt of a job.

    ``idempotency_key`` is the same on every attempt and replay (R-6); ``errors``
    the history so far, newest last; ``replay_count`` how often the job was sent
    again from the dead-letter queue.
    """

    job_id: str
    attempt: int
    idempotency_key: str
    errors: tuple[ErrorEntry, ...]
    replay_count: int = 0

    @property
    def is_retry(self) -> bool:
        """Whether an earlier attempt of this job failed."""
        return self.attempt > 1
