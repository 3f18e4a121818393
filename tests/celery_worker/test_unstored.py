"""A success Celery cannot store (a result its serializer cannot encode) ends the job
FAILURE in Celery; the record says the same, not ``completed`` (Redis broker and backend)."""

from __future__ import annotations

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
    with redis_app(redis_url, "unstored") as app:
        yield app


def test_a_result_celery_cannot_encode_ends_the_record_failed(app: Celery) -> None:
    runs: list[float] = []

    @app.task(base=OjsTask, bind=True, shared=False, name="unstored.job",
              retry_policy={"max_attempts": 3})
    def job(self: Any) -> object:
        runs.append(time.monotonic())
        return object()  # JSON cannot hold it: Celery stores FAILURE (EncodeError)

    @app.task(shared=False, name="wake")
    def wake() -> None: ...

    with start_worker(app, pool="threads", concurrency=1, perform_ping_check=False,
                      loglevel="CRITICAL", shutdown_timeout=10):
        sent = job.apply_async()
        deadline = time.monotonic() + 15
        while app.AsyncResult(sent.id).state != "FAILURE":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(0.3)  # the record's correction follows the FAILURE write in the thread
        wake_for_shutdown(wake)
    record = get_job_record(sent.id, app=app)
    assert record is not None
    assert (record.state, record.outcome, record.attempt) == ("discarded", "failed", 1)
    assert [(e.attempt, e.type) for e in record.errors] == [(1, "kombu.exceptions.EncodeError")]
    assert record.extra["end_reason"] == "the result could not be stored"
    assert len(runs) == 1  # Celery does not retry it, nor does OJS
