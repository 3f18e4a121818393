"""Redeliveries the broker makes on its own, simulated on every broker with an in-process worker.

A redelivered message is byte-identical to the first delivery, so the job
record decides what it is: a lost attempt (record ``active`` at this attempt),
or a duplicate of an attempt that already finished. The subprocess tests in
``test_crashes`` produce the real thing with SIGKILL.
"""

from __future__ import annotations

import time
import uuid

from celery import signals

from celery_ext import get_job_record
from celery_ext.records import RecordStore
from ojs_adapters import JobRecord
from ojs_adapters.history import ErrorEntry
from ojs_adapters.runtime.handoff import HANDED_OFF
from tests.celery_ext.conftest import Env
from tests.celery_ext.support import RUNS, drain, wait_for

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


def test_a_dead_letter_redone_by_a_redelivery_runs_celery_s_failure_path_once(env: Env) -> None:
    """RET-17: the record says the dead letter was decided but not on its queue (the broker
    refused it and the original was requeued): the redelivery publishes it, unrun, and
    Celery's failure path (FAILURE stored, errbacks, task_failure) is not run a second time."""
    queue = env.take_queue()
    task = env.tasks["scripted"]
    task_id = str(uuid.uuid4())
    entry = ErrorEntry(1, "HANDLER_ERROR", "ValueError", "boom", "2026-11-27T00:00:00Z")
    decided = JobRecord(id=task_id, type=task.name, queue=queue, max_attempts=1,
                        extra={"dead_letter_queue": f"{queue}.dead_letter"}).started(1)
    RecordStore(env.app.backend).save(decided.failed(entry, action="dead_letter"))
    failures: list[str] = []

    def note(sender: object = None, task_id: str = "", **_: object) -> None:
        failures.append(task_id)

    signals.task_failure.connect(note, weak=False)
    try:
        task.apply_async((["ok"],), task_id=task_id, queue=queue,
                         retry_policy={"max_attempts": 1, "on_exhaustion": "dead_letter"})
        [letter] = drain(env.app, f"{queue}.dead_letter", timeout=20, expect=1)
        assert letter.headers["id"] == task_id
        marker = task.apply_async((["ok"],), queue=queue)  # processed after the redelivery
        assert marker.get(**GET) == "ok"
        wait_for(lambda: (get_job_record(task_id, app=env.app) or decided).extra.get(
            HANDED_OFF) is not None)
    finally:
        signals.task_failure.disconnect(note)
    assert task_id not in failures
    assert RUNS[task_id] == []  # never run: only the dead letter is published
