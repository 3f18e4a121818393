"""The Celery settings an ``OjsTask`` relies on, checked when a worker starts.

``OjsTask`` sets what it needs itself; these checks catch what an app or a
task overrode:

- ``acks_late`` and ``reject_on_worker_lost`` on: otherwise a crashed or
  hard-time-limited attempt loses its message and cannot be counted (RET-12).
- a result backend that stores (not RPC, not disabled): the job record lives
  there, and crash counting reads it.
- ``task_always_eager`` off: eager retries run at once, ignoring countdowns.
- a result backend with leases and claims (Redis): others keep records only.
- no task that sets OjsTask options (``retry_policy``, ...) without being one.
- Redis with the visibility heartbeat off (``ojs_visibility_heartbeat =
  False``; ``_heartbeat``): ``visibility_timeout`` longer than the longest
  countdown that waits in a worker (at most ``ojs_park_after``: longer ones are
  parked, ``_parking``) and time limit, or the broker hands a waiting retry or a
  running attempt out again (a duplicate, counted as a crash).

``check_worker_settings(app)`` returns the problems; the ``worker_init``
receiver logs each as a warning.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import signals

from celery_ext._eager_warnings import EAGER_WARNED, warn_eager_once, warn_not_eager_once
from celery_ext._heartbeat import HEARTBEAT_SETTING
from celery_ext._parking import PARK_SETTING, park_after
from celery_ext.records import RecordStore
from celery_ext.task import OjsTask
from ojs_adapters.errors import OjsValidationError
from ojs_adapters.runtime.parking import DEFAULT_PARK_AFTER, park_threshold

logger = logging.getLogger("celery_ext")

# The eager-call warnings moved to ``_eager_warnings``; kept importable from here.
__all__ = ["EAGER_WARNED", "OJS_TASK_OPTIONS", "check_worker_settings", "warn_eager_once",
           "warn_not_eager_once"]


def check_worker_settings(app: Any) -> list[str]:
    """Problems with ``app``'s settings for its OjsTasks, as sentences (empty: all good).

    >>> from celery import Celery
    >>> app = Celery("demo", broker="memory://", backend="redis://localhost")
    >>> @app.task(base=OjsTask, shared=False)
    ... def charge(order_id): ...
    >>> check_worker_settings(app)
    []
    >>> app.conf.task_always_eager = True
    >>> print(*check_worker_settings(app))  # doctest: +ELLIPSIS
    task_always_eager runs each OjsTask once in the caller: no retries, ...
    """
    problems = [f"{t.name}: {', '.join(o)} ignored: the task is not an OjsTask, so it "
                "is neither retried nor dead-lettered by the policy; declare it with "
                "base=OjsTask, or make OjsTask every task's base with Celery(..., "
                "task_cls=OjsTask)" for t, o in _plain_tasks_with_ojs_options(app, OjsTask)]
    tasks = [t for t in app.tasks.values() if isinstance(t, OjsTask) and not t.native]
    if not tasks:
        return problems
    for task in tasks:
        if not task.acks_late:
            problems.append(f"{task.name}: acks_late is off, so a crashed attempt loses its "
                            "message instead of consuming one attempt (RET-12)")
        if not task.reject_on_worker_lost:
            problems.append(f"{task.name}: reject_on_worker_lost is off, so a lost worker "
                            "acks the message instead of consuming one attempt (RET-12)")
    store = RecordStore(app.backend)
    backend = type(app.backend).__name__
    if not store.enabled:
        problems.append(f"result backend {backend} stores no job record: get_job_record() "
                        "and crash counting are off, and leases and attempt claims with "
                        "them; set a redis:// result backend for all of them")
    elif not store.leases:
        problems.append(f"result backend {backend} keeps job records but no leases or "
                        "attempt claims: an attempt handed out again while it runs (a lost "
                        "connection, a visibility timeout) can run twice, and is counted as "
                        "a crash; set a redis:// result backend for them")
    if app.conf.task_always_eager:
        problems.append("task_always_eager runs each OjsTask once in the caller: no "
                        "retries, no countdowns, no dead letters (the policy is skipped)")
    try:
        park_threshold(app.conf.get(PARK_SETTING, DEFAULT_PARK_AFTER), field=PARK_SETTING)
    except OjsValidationError as error:
        problems.append(f"{error.message} (the default, {DEFAULT_PARK_AFTER:g}s, applies)")
    problems.extend(_redis_visibility_problems(app, tasks))
    if store.leases:
        problems.extend(_expiry_problems(app.backend.expires, tasks))
    return problems


def _expiry_problems(expires: Any, tasks: list[Any]) -> list[str]:
    """Tasks whose records and claims (kept ``result_expires``) can lapse while an attempt
    runs (its time limit) or waits for its retry (the longest countdown)."""
    if not expires:
        return []
    out = []
    for task in tasks:
        longest = max(task.policy().max_interval.total_seconds(),
                      float(task.time_limit or task.soft_time_limit or 0))
        if longest >= float(expires):
            out.append(f"{task.name}: result_expires ({float(expires):g}s) is not above its "
                       f"longest retry countdown or time limit ({longest:g}s): its job record "
                       "and attempt claims can expire meanwhile, so a crash is not counted "
                       "(RET-12) and a retry sent twice can run twice; raise result_expires")
    return out


#: Class options that mean something only on an OjsTask.
OJS_TASK_OPTIONS = ("retry_policy", "retry_budget", "dead_letter_queue", "jitter_source")


def _plain_tasks_with_ojs_options(app: Any, ojs_task: type) -> list[tuple[Any, list[str]]]:
    """Tasks that set OjsTask options without being OjsTasks (the options do nothing)."""
    found = []
    for task in app.tasks.values():
        if isinstance(task, ojs_task):
            continue
        given = [name for name in OJS_TASK_OPTIONS if getattr(task, name, None) is not None]
        if given:
            found.append((task, given))
    return found


def _redis_visibility_problems(app: Any, tasks: list[Any]) -> list[str]:
    url = str(app.conf.broker_url or "")
    if not url.startswith(("redis", "rediss", "sentinel")) or app.conf.get(HEARTBEAT_SETTING,
                                                                           True):
        return []  # the heartbeat keeps held deliveries reserved (RET-13)
    visibility = float((app.conf.broker_transport_options or {}).get("visibility_timeout", 3600))
    longest = max(t.policy().max_interval.total_seconds() for t in tasks)
    parked_after = park_after(app)
    if parked_after is not None:  # a longer wait is parked on the broker (_parking)
        longest = min(longest, parked_after)
    limits = [float(t.time_limit or t.soft_time_limit or 0) for t in tasks]
    out = []
    if longest >= visibility:
        out.append(f"Redis visibility_timeout ({visibility:g}s) is not above the longest "
                   f"retry countdown ({longest:g}s): waiting retries would be redelivered")
    if max(limits) >= visibility:
        out.append(f"Redis visibility_timeout ({visibility:g}s) is not above the longest "
                   f"time limit ({max(limits):g}s): running attempts would be redelivered")
    return out


def _warn_at_worker_start(sender: Any = None, **_: Any) -> None:
    app = getattr(sender, "app", None)
    if app is None:
        return
    for problem in check_worker_settings(app):
        logger.warning("ojs-adapters: %s", problem)


signals.worker_init.connect(_warn_at_worker_start, weak=False)
