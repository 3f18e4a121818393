"""Celery's ``STARTED`` state (``task_track_started``), stored once admission let it run.

Celery stores ``STARTED`` before it calls the task, so before admission: a duplicate
delivery (a redelivered original of a job that ended, a second copy of a retry) wrote it
over the job's ``SUCCESS``, ``FAILURE`` or ``RETRY`` and then ended unrun, leaving
``AsyncResult`` at ``STARTED`` for ever. An ``OjsTask`` takes the option over: Celery's
tracer sees it off, and the attempt stores ``STARTED`` as it starts.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from celery import states

from ojs_adapters.runtime.backend_retry import count_failure

logger = logging.getLogger("celery_ext")

#: The class attribute that keeps the task's ``track_started`` once taken over.
TRACKS_STARTED = "ojs_track_started"


def take_over(cls: Any) -> None:
    """Move ``cls.track_started`` (bound from the app's settings) to ``TRACKS_STARTED``."""
    if cls.track_started:
        setattr(cls, TRACKS_STARTED, True)
        cls.track_started = False
    elif TRACKS_STARTED not in cls.__dict__ and "track_started" in cls.__dict__:
        setattr(cls, TRACKS_STARTED, False)  # off on this class, though on on a base


def store_started(task: Any) -> None:
    """Store ``STARTED`` for the running attempt, as Celery's tracer would have; a store
    that fails is logged (the state is informational: the attempt goes on)."""
    request = task.request
    if not getattr(task, TRACKS_STARTED, False) or _ignores_result(task, request):
        return
    try:
        task.backend.store_result(request.id, {"pid": os.getpid(), "hostname": request.hostname},
                                  states.STARTED, request=request)
    except Exception:
        count_failure("store STARTED", "failed")
        logger.warning("%s[%s]: cannot store STARTED", task.name, request.id, exc_info=True)


def _ignores_result(task: Any, request: Any) -> bool:
    """Celery's rule: the request's own ``ignore_result`` if it set one, else the task's."""
    own = vars(request).get("ignore_result")
    return bool(task.ignore_result if own is None else own)
