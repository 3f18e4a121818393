"""``current_job()``: the running attempt's ``JobContext``, as ``dramatiq_ext`` names it.

The same value as ``self.ojs`` in a bound task, for code that has no ``self`` (a helper
the task calls, an unbound task).
"""

from __future__ import annotations

import threading
from typing import Any

from celery import current_task

from celery_ext._headers import HeaderState
from ojs_adapters import JobContext
from ojs_adapters.runtime.dlq import replay_info

#: Attribute of the task request holding the running attempt's ``JobContext``.
CONTEXT_ATTRIBUTE = "ojs_context"

#: ``RUNNING.id``: the task id whose delivery this thread runs (``run_attempt``); a call of
#: the task from its own body is then a plain call, as Celery makes it, not a delivery.
RUNNING = threading.local()


def current_job() -> JobContext | None:
    """The running ``OjsTask`` attempt's context; ``None`` outside one."""
    task = current_task._get_current_object()  # the proxy's class is not the task's
    if task is None or not hasattr(type(task), "ojs") or task.request.id is None:
        return None
    context: JobContext = task.ojs
    return context


def job_context(request: Any) -> JobContext:
    """The ``JobContext`` of a request, read from its headers (outside ``run_attempt``)."""
    state = HeaderState.from_headers(request.headers)
    replays = replay_info(request.headers).get("replay_count") or 0
    return JobContext(job_id=str(request.id), attempt=state.attempt,
                      idempotency_key=state.idempotency_key or str(request.id),
                      errors=state.errors, replay_count=int(replays))
