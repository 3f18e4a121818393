"""The Celery app the worker *subprocesses* of ``test_celery_parking`` run (``celery -A``).

Configured from the environment: ``OJS_TEST_BROKER`` (Redis or RabbitMQ URL),
``OJS_TEST_BACKEND`` (Redis), ``OJS_TEST_PREFIX`` (the Redis ``global_keyprefix``
and the RabbitMQ ``ojs_park_prefix``) and ``OJS_TEST_PARK_AFTER`` (the app's
``ojs_park_after``, seconds). The Redis mover polls every 0.2 s. Each run of a
task body appends ``{"attempt", "worker", "at"}`` to the Redis list named by its
``marker`` argument, and each receipt of a message appends ``{"worker", "at",
"eta"}`` to ``<prefix>:received:<task id>``.
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
#: The retry delay: over the test's parking threshold; on RabbitMQ 3 whole seconds, so
#: a park passes level 1 and then, dead-lettered, level 0.
DELAY = 3.5
RETRY_POLICY = {"max_attempts": 3, "initial_interval": f"PT{DELAY:g}S",
                "max_interval": f"PT{DELAY:g}S", "jitter": False}

app = Celery("ojs_park", broker=BROKER, backend=BACKEND)
app.conf.update(
    broker_transport_options=(
        {"global_keyprefix": PREFIX + ":"} if BROKER.startswith("redis") else {}),
    result_backend_transport_options={"global_keyprefix": PREFIX + ":"},
    result_expires=600,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    ojs_park_after=float(os.environ.get("OJS_TEST_PARK_AFTER", "1")),
    ojs_park_prefix=PREFIX,
    ojs_park_poll_interval=0.2,
)
_markers = redis.Redis.from_url(BACKEND)


def _note(key: str, **data: Any) -> None:
    _markers.rpush(key, json.dumps(data))
    _markers.expire(key, 600)


@signals.task_received.connect
def _received(request: Any, **_: Any) -> None:
    """Note which worker received a delivery, when, and whether it waits for an ETA."""
    if request.task.app is not app:  # doctest collection imports this module into pytest
        return
    _note(f"{PREFIX}:received:{request.id}", worker=os.getpid(), at=time.time(),
          eta=request.eta is not None)


@app.task(shared=False, base=OjsTask, bind=True, name="ojs_park.fails",
          retry_policy=RETRY_POLICY)
def fails(self: Any, marker: str, failures: int) -> str:
    """The first ``failures`` attempts fail (each retry is parked for ``DELAY`` s)."""
    attempt = HeaderState.from_headers(self.request.headers).attempt
    _note(marker, attempt=attempt, worker=os.getppid(), at=time.time())
    if attempt <= failures:
        raise ValueError(f"attempt {attempt} fails")
    return "ok"
