"""The Celery app the worker *subprocesses* of ``test_celery_visibility`` run (``celery -A``).

Configured from the environment: ``OJS_TEST_BROKER``, ``OJS_TEST_BACKEND``,
``OJS_TEST_PREFIX`` (the Redis ``global_keyprefix``), ``OJS_TEST_VISIBILITY``
(the Redis ``visibility_timeout``, seconds) and ``OJS_TEST_HEARTBEAT`` (``0``
turns the adapter's visibility heartbeat off, for a control run). Kombu's
restore sweep runs every second, so an expired reservation is handed out again
at once. Each run of a task body appends ``{"attempt", "worker", "at"}`` to the
Redis list named by its ``marker`` argument (``worker``: the pid of the worker's
main process), and each receipt of a message appends ``{"worker", "eta"}`` to
``<prefix>:received:<task id>``.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import Celery, signals

from celery_ext import OjsTask
from celery_ext._headers import HeaderState

PREFIX = os.environ.get("OJS_TEST_PREFIX", "ojs-test-local")
BROKER = os.environ.get("OJS_TEST_BROKER", "redis://127.0.0.1:6379/0")
BACKEND = os.environ.get("OJS_TEST_BACKEND", "redis://127.0.0.1:6379/0")
VISIBILITY = float(os.environ.get("OJS_TEST_VISIBILITY", "2"))
#: A long job's policy: a duplicate would be counted as a lost attempt and retried fast.
LONG_POLICY = {"max_attempts": 3, "initial_interval": "PT0.2S", "jitter": False}
#: The retried job's policy: its one retry waits 5 s, well past the visibility timeout.
RETRY_POLICY = {"max_attempts": 3, "initial_interval": "PT5S", "max_interval": "PT5S",
                "jitter": False}

app = Celery("ojs_rel", broker=BROKER, backend=BACKEND)
app.conf.update(
    broker_transport_options=(
        {"global_keyprefix": PREFIX + ":", "visibility_timeout": VISIBILITY,
         "unacked_restore_interval": 1, "unacked_restore_throttle": 1}
        if BROKER.startswith("redis") else {}),
    result_backend_transport_options={"global_keyprefix": PREFIX + ":"},
    result_expires=600,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    ojs_visibility_heartbeat=os.environ.get("OJS_TEST_HEARTBEAT", "1") != "0",
)
_markers = redis.Redis.from_url(BACKEND)


def _mark(task: Any, marker: str) -> int:
    attempt = HeaderState.from_headers(task.request.headers).attempt
    _markers.rpush(marker, json.dumps({"attempt": attempt, "worker": os.getppid(),
                                       "at": time.time()}))
    _markers.expire(marker, 600)
    return attempt


@signals.task_received.connect
def _received(request: Any, **_: Any) -> None:
    """Note which worker holds a delivery, and whether it waits for an ETA."""
    if request.task.app is not app:  # doctest collection imports this module into pytest
        return
    key = f"{PREFIX}:received:{request.id}"
    _markers.rpush(key, json.dumps({"worker": os.getpid(), "eta": request.eta is not None}))
    _markers.expire(key, 600)


@app.task(shared=False, base=OjsTask, bind=True, name="ojs_rel.long_job",
          retry_policy=LONG_POLICY)
def long_job(self: Any, marker: str, seconds: float) -> str:
    """Runs ``seconds``, longer than the visibility timeout, then succeeds."""
    _mark(self, marker)
    time.sleep(seconds)
    return "ok"


@app.task(shared=False, base=OjsTask, bind=True, name="ojs_rel.fails_once",
          retry_policy=RETRY_POLICY)
def fails_once(self: Any, marker: str) -> str:
    """Attempt 1 fails (its retry waits 5 s in a worker's memory); attempt 2 succeeds."""
    if _mark(self, marker) == 1:
        raise ValueError("first attempt fails")
    return "ok"
