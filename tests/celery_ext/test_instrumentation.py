"""``OjsTask`` reports each decision it executes once to the core hooks (R-9, R-10).

A scripted run on memory://: one job retried to success, one exhausted into the
dead-letter queue, one non-retryable, one failed by its handler. The Prometheus
counters and the structured log then say exactly that, and the log never holds a
task argument (the task puts them in its exception messages to make sure).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator

import pytest

from celery_ext.records import RecordStore
from ojs_adapters import JobRecord
from ojs_adapters.runtime.events import DecisionEvent, add_hook, remove_hook
from tests.celery_ext.conftest import Env
from tests.celery_ext.support import wait_for

prometheus_client = pytest.importorskip("prometheus_client")

from ojs_adapters.runtime.metrics import PrometheusMetrics  # noqa: E402

#: Task arguments that must never reach a log record.
SECRETS = ("4242-4242-4242-4242", "alice@example.com")
FAST = {"initial_interval": "PT0.02S", "backoff_coefficient": 2.0, "jitter": False}

pytestmark = pytest.mark.parametrize("env", ["memory"], indirect=True)


class Mine:
    """The events of this test's jobs only (the session worker may still run others')."""

    def __init__(self) -> None:
        self.ids: set[str] = set()
        self.events: list[DecisionEvent] = []
        self.registry = prometheus_client.CollectorRegistry()
        self.metrics = PrometheusMetrics(self.registry)

    def new_id(self) -> str:
        task_id = str(uuid.uuid4())
        self.ids.add(task_id)
        return task_id

    def __call__(self, event: DecisionEvent) -> None:
        if event.job_id in self.ids:
            self.events.append(event)
            self.metrics(event)

    def of(self, task_id: str) -> list[str]:
        return [e.decision.action for e in self.events if e.job_id == task_id]

    def value(self, name: str, **labels: str) -> float | None:
        found: float | None = self.registry.get_sample_value(name, labels)
        return found


@pytest.fixture
def mine() -> Iterator[Mine]:
    hook = Mine()
    add_hook(hook)
    try:
        yield hook
    finally:
        remove_hook(hook)


def test_r9_r10_one_event_per_decision_counted_and_logged_without_arguments(
        env: Env, mine: Mine, caplog: pytest.LogCaptureFixture) -> None:
    task = env.tasks["payment"]
    retried_queue, exhausted_queue = env.take_queue(), env.take_queue()
    jobs = [  # (task id, script, policy, queue)
        (mine.new_id(), ["raise:value", "raise:value", "ok"], {**FAST, "max_attempts": 3},
         retried_queue),
        (mine.new_id(), ["raise:value"], {**FAST, "max_attempts": 2,
                                          "on_exhaustion": "dead_letter"}, exhausted_queue),
        (mine.new_id(), ["raise:stolen"], {**FAST, "max_attempts": 5, "non_retryable_errors": [
            "tests.celery_ext.support.PaymentError"]}, retried_queue),
        (mine.new_id(), ["fail"], {**FAST, "max_attempts": 5}, retried_queue),
    ]
    with caplog.at_level(logging.INFO, logger="ojs_adapters.retry"):
        for task_id, script, policy, queue in jobs:
            task.apply_async((*SECRETS, script), task_id=task_id, queue=queue,
                             retry_policy=policy)
        wait_for(lambda: len(mine.events) >= 6, timeout=20)
    ids = [job[0] for job in jobs]

    # One event per failed attempt: 2 + 2 + 1 + 1, each naming its job and queue.
    assert [mine.of(i) for i in ids] == [
        ["retry", "retry"], ["retry", "dead_letter"], ["discard"], ["fail"]]
    assert {(e.framework, e.task) for e in mine.events} == {("celery", task.name)}
    assert [e.queue for e in mine.events if e.job_id == ids[1]] == [exhausted_queue] * 2
    assert [e.max_attempts for e in mine.events if e.job_id == ids[1]] == [2, 2]

    value = mine.value
    assert value("ojs_retry_attempts_total", task=task.name, queue=retried_queue,
                 attempt="2") == 1
    assert value("ojs_retry_attempts_total", task=task.name, queue=retried_queue,
                 attempt="3") == 1
    assert value("ojs_retry_attempts_total", task=task.name, queue=exhausted_queue,
                 attempt="2") == 1
    assert value("ojs_retry_exhausted_total", task=task.name, queue=exhausted_queue) == 1
    assert value("ojs_retry_exhausted_total", task=task.name, queue=retried_queue) is None
    assert value("ojs_dead_letter_total", queue=exhausted_queue) == 1
    assert value("ojs_discarded_total", reason="non_retryable") == 1
    assert value("ojs_discarded_total", reason="fail") == 1
    assert value("ojs_discarded_total", reason="exhausted") is None
    assert value("ojs_retry_backoff_seconds_count") == 3
    assert value("ojs_retry_backoff_seconds_sum") == pytest.approx(0.02 + 0.04 + 0.02)

    # Celery's own worker log may print arguments; the decision log must not.
    logged = [r for r in caplog.records if r.name == "ojs_adapters.retry"
              and r.__dict__["ojs"]["correlation_id"] in mine.ids]
    assert len(logged) == 6
    assert {r.__dict__["ojs"]["correlation_id"] for r in logged} == set(ids)
    for secret in SECRETS:
        assert all(secret not in r.getMessage() and secret not in str(r.__dict__)
                   for r in logged)


def test_a_lost_worker_is_one_event(env: Env, mine: Mine) -> None:
    """The crash path (a redelivered running attempt) executes one decision, so one event."""
    task, queue, task_id = env.tasks["payment"], env.take_queue(), mine.new_id()
    running = JobRecord(id=task_id, type=task.name, queue=queue, max_attempts=1).started(1)
    RecordStore(env.app.backend).save(running)
    task.apply_async((*SECRETS, ["ok"]), task_id=task_id, queue=queue,
                     retry_policy={**FAST, "max_attempts": 1})
    wait_for(lambda: mine.events, timeout=20)
    time.sleep(0.3)  # room for a second event, which must not come
    [event] = mine.events
    assert (event.decision.action, event.decision.entry.code) == ("discard", "HANDLER_PANIC")
