"""``task_track_started`` with ``OjsTask``: STARTED while an admitted attempt runs, and
never written by a duplicate delivery over the job's outcome (Redis broker and backend)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker

from celery_ext import OjsTask, get_job_record
from tests.celery_ext.support import redis_app, wake_for_shutdown


@pytest.fixture
def app(redis_url: str) -> Iterator[Celery]:
    with redis_app(redis_url, "started", task_track_started=True) as app:
        yield app


def _settled(app: Celery, task_id: str, state: str) -> None:
    deadline = time.monotonic() + 15
    while app.AsyncResult(task_id).state != state:
        assert time.monotonic() < deadline, app.AsyncResult(task_id).state
        time.sleep(0.02)


def test_a_duplicate_delivery_leaves_the_outcome_as_it_was(app: Celery) -> None:
    running, go = threading.Event(), threading.Event()

    @app.task(base=OjsTask, bind=True, shared=False, name="started.dead",
              retry_policy={"max_attempts": 1, "on_exhaustion": "dead_letter"})
    def dead(self: Any) -> None:
        raise ValueError("boom")

    @app.task(base=OjsTask, bind=True, shared=False, name="started.slow")
    def slow(self: Any) -> str:
        running.set()
        go.wait(10)
        return "done"

    @app.task(shared=False, name="wake")
    def wake() -> None: ...

    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False,
                      loglevel="CRITICAL", shutdown_timeout=10):
        ended = dead.apply_async()
        _settled(app, ended.id, "FAILURE")
        dead.apply_async(task_id=ended.id)  # the same job delivered again (a lost ack)
        time.sleep(1.0)  # the duplicate has come and gone
        assert app.AsyncResult(ended.id).state == "FAILURE"
        record = get_job_record(ended.id, app=app)
        assert record is not None and (record.state, record.outcome) == (
            "discarded", "dead_letter")

        started = slow.apply_async()
        assert running.wait(10)
        assert app.AsyncResult(started.id).state == "STARTED"  # Celery's option still holds
        go.set()
        _settled(app, started.id, "SUCCESS")
        wake_for_shutdown(wake)
