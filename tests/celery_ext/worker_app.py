"""The Celery app a worker *subprocess* runs in the crash and time-limit tests.

Configured from the environment (``OJS_TEST_BROKER``, ``OJS_TEST_BACKEND``,
``OJS_TEST_PREFIX``), because SIGKILL and hard time limits need a real
prefork worker in a process of its own. Each run of a task appends
``{"attempt", "pid"}`` to the Redis list named by its ``marker`` argument, so
the test sees how often the body ran, and in which process.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import Celery

from celery_ext import OjsTask
from celery_ext._headers import HeaderState

PREFIX = os.environ.get("OJS_TEST_PREFIX", "ojs-test-local")
BROKER = os.environ.get("OJS_TEST_BROKER", "redis://127.0.0.1:6379/0")
BACKEND = os.environ.get("OJS_TEST_BACKEND", "redis://127.0.0.1:6379/0")
#: Policy of the tasks below: short (under the 3 s Redis visibility timeout), jitter off.
POLICY = {"max_attempts": 3, "initial_interval": "PT0.2S", "max_interval": "PT1S", "jitter": False}

app = Celery("ojs_crash", broker=BROKER, backend=BACKEND)
app.conf.update(
    broker_transport_options=(
        {"global_keyprefix": PREFIX + ":", "visibility_timeout": 3,
         "unacked_restore_interval": 1, "unacked_restore_throttle": 1}
        if BROKER.startswith("redis") else {}),
    result_backend_transport_options={"global_keyprefix": PREFIX + ":"},
    result_expires=600,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
)
_markers = redis.Redis.from_url(BACKEND)


def _mark(task: Any, marker: str) -> int:
    attempt = HeaderState.from_headers(task.request.headers).attempt
    _markers.rpush(marker, json.dumps({"attempt": attempt, "pid": os.getpid()}))
    _markers.expire(marker, 600)
    return attempt


@app.task(shared=False, base=OjsTask, bind=True, name="ojs_crash.hangs_first", retry_policy=POLICY)
def hangs_first(self: Any, marker: str) -> str:
    """Attempt 1 hangs (to be killed); later attempts succeed."""
    if _mark(self, marker) == 1:
        time.sleep(60)
    return "ok"


@app.task(shared=False, base=OjsTask, bind=True, name="ojs_crash.limited", retry_policy=POLICY,
          time_limit=1)
def limited(self: Any, marker: str) -> str:
    """Attempt 1 runs past its 1 s hard time limit; later attempts succeed."""
    if _mark(self, marker) == 1:
        time.sleep(60)
    return "ok"


@app.task(shared=False, base=OjsTask, bind=True, name="ojs_crash.soft_limited",
          retry_policy=POLICY, soft_time_limit=0.5)
def soft_limited(self: Any, marker: str) -> str:
    """Attempt 1 runs past its 0.5 s soft time limit (SoftTimeLimitExceeded in the body)."""
    if _mark(self, marker) == 1:
        time.sleep(60)
    return "ok"


@app.task(shared=False, base=OjsTask, bind=True, name="ojs_crash.soft_then_retry",
          retry_policy=POLICY, soft_time_limit=0.5)
def soft_then_retry(self: Any, marker: str) -> str:
    """Attempt 1 runs past its soft time limit and asks for a retry, as Celery code does
    (``except SoftTimeLimitExceeded: raise self.retry(countdown=...)``)."""
    from celery.exceptions import SoftTimeLimitExceeded

    if _mark(self, marker) == 1:
        try:
            time.sleep(60)
        except SoftTimeLimitExceeded:
            raise self.retry(countdown=0.3) from None
    return "ok"
