"""Redeliveries the broker makes on its own, simulated on every broker with an in-process worker.

A redelivered message is byte-identical to the first delivery, so the job
record decides what it is: a lost attempt (record ``active`` at this attempt),
or a duplicate of an attempt that already finished. The subprocess tests in
``test_crashes`` produce the real thing with SIGKILL.
"""

from __future__ import annotations

import time
import uuid

from celery_ext import get_job_record
from celery_ext.records import RecordStore
from ojs_adapters import JobRecord
from tests.celery_ext.conftest import Env
from tests.celery_ext.support import RUNS

GET = {"timeout": 20, "interval": 0.02}


def test_ret12_delivery_of_an_attempt_the_record_shows_active_counts_a_lost_worker(
        env: Env) -> None:
    """Record says attempt 1 is active when attempt 1 arrives: HANDLER_PANIC, one attempt."""
    task = env.tasks["scripted"]
    task_id = str(uuid.uuid4())
    RecordStore(env.app.backend).save(JobRecord(
        id=task_id, type=task.name, queue="q", max_attempts=3).started(1))
    result = task.apply_async((["ok"],), task_id=task_id, queue=env.take_queue())
    assert result.get(**GET) == "ok"
    record = get_job_record(task_id, app=env.app)
    assert record is not None
    assert (record.state, record.attempt) == ("completed", 2)
    [entry] = record.errors
    assert (entry.attempt, entry.code, entry.type) == (1, "HANDLER_PANIC", "ojs.worker_lost")
    assert [r.attempt for r in RUNS[task_id]] == [2]  # the lost attempt is not run again


def test_duplicate_delivery_of_a_finished_attempt_is_dropped(env: Env) -> None:
    """A completed job delivered again (an ack lost after success) does not run again."""
    queue = env.take_queue()
    task = env.tasks["scripted"]
    first = task.apply_async((["ok"],), queue=queue)
    assert first.get(**GET) == "ok"
    task.apply_async((["ok"],), task_id=first.id, queue=queue)  # the duplicate
    marker = task.apply_async((["ok"],), queue=queue)  # processed after the duplicate
    assert marker.get(**GET) == "ok"
    time.sleep(0.3)  # threads pool: give the duplicate time to run, were it to run
    assert [r.attempt for r in RUNS[first.id]] == [1]
    record = get_job_record(first.id, app=env.app)
    assert record is not None and (record.state, record.attempt) == ("completed", 1)


def test_handler_reject_requeue_is_not_counted_as_a_crash(env: Env) -> None:
    """``raise Reject(requeue=True)`` from the body is Celery control flow: the requeued
    delivery runs attempt 1 again instead of recording HANDLER_PANIC."""
    result = env.tasks["scripted"].apply_async((["reject-once"],), queue=env.take_queue())
    assert result.get(**GET) == "ok"
    assert [r.attempt for r in RUNS[result.id]] == [1, 1]
    record = get_job_record(result.id, app=env.app)
    assert record is not None
    assert (record.state, record.attempt, record.errors) == ("completed", 1, ())
