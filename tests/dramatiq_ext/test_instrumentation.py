"""``OjsRetries`` reports each decision it executes once to the core hooks (R-9, R-10).

A scripted run on StubBroker: one job retried to success, one exhausted into the
dead-letter queue, one non-retryable, one failed by its handler. The Prometheus
counters and the structured log then say exactly that, and the log never holds a
job argument (the handlers put them in their exception messages to make sure).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from ojs_adapters import JobError
from ojs_adapters.runtime.events import DecisionEvent, add_hook, remove_hook
from tests.dramatiq_ext.harness import Env, crashed_attempt

prometheus_client = pytest.importorskip("prometheus_client")

from ojs_adapters.runtime.metrics import PrometheusMetrics  # noqa: E402

#: Job arguments that must never reach a log record.
SECRETS = ("4242-4242-4242-4242", "alice@example.com")
FAST = {"initial_interval": "PT0.02S", "jitter": False}


class CardStolen(Exception):
    ojs_error_type = "payment.card_stolen"


@pytest.fixture
def events() -> Iterator[list[DecisionEvent]]:
    seen: list[DecisionEvent] = []
    add_hook(seen.append)
    try:
        yield seen
    finally:
        remove_hook(seen.append)


def failing(failures: int, exc: type[Exception] = ValueError) -> Any:
    """A body that fails ``failures`` times with its arguments in the message, then succeeds."""
    calls: list[int] = []

    def job(card: str, email: str) -> None:
        calls.append(1)
        if len(calls) <= failures:
            raise exc(f"declined {card} for {email}")

    return job


def failed_by_handler(card: str, email: str) -> None:
    raise JobError("order.invalid", f"bad {card} {email}", code="FAIL")


def test_r9_r10_one_event_per_decision_counted_and_logged_without_arguments(
        stub_env: Env, events: list[DecisionEvent], caplog: pytest.LogCaptureFixture) -> None:
    registry = prometheus_client.CollectorRegistry()
    metrics = PrometheusMetrics(registry)
    add_hook(metrics)
    try:
        retried = stub_env.actor(failing(2), retry_policy={**FAST, "max_attempts": 3})
        exhausted = stub_env.actor(failing(99), retry_policy={
            **FAST, "max_attempts": 2, "on_exhaustion": "dead_letter"})
        stolen = stub_env.actor(failing(99, CardStolen), retry_policy={
            **FAST, "max_attempts": 5, "non_retryable_errors": ["payment.*"]})
        failed = stub_env.actor(failed_by_handler, retry_policy={**FAST, "max_attempts": 5})
        stub_env.start()
        with caplog.at_level(logging.INFO, logger="ojs_adapters.retry"):
            messages = [actor.send(*SECRETS) for actor in (retried, exhausted, stolen, failed)]
            records = [stub_env.wait_record(m.message_id) for m in messages]
            stub_env.dead_letters(expect=1)
    finally:
        remove_hook(metrics)
    assert [r.outcome for r in records] == ["completed", "dead_letter", "discarded", "failed"]

    # One event per failed attempt: 2 + 2 + 1 + 1, each naming its job, never its arguments.
    queue = stub_env.queue
    by_job = {m.message_id: [e for e in events if e.job_id == m.message_id] for m in messages}
    assert [[e.decision.action for e in by_job[m.message_id]] for m in messages] == [
        ["retry", "retry"], ["retry", "dead_letter"], ["discard"], ["fail"]]
    assert {(e.framework, e.queue) for e in events} == {("dramatiq", queue)}
    assert [e.max_attempts for e in by_job[messages[1].message_id]] == [2, 2]
    assert {e.task for e in by_job[messages[0].message_id]} == {retried.actor_name}

    def value(name: str, **labels: str) -> float | None:
        found: float | None = registry.get_sample_value(name, labels)
        return found

    assert value("ojs_retry_attempts_total", task=retried.actor_name, queue=queue,
                 attempt="2") == 1
    assert value("ojs_retry_attempts_total", task=retried.actor_name, queue=queue,
                 attempt="3") == 1
    assert value("ojs_retry_attempts_total", task=exhausted.actor_name, queue=queue,
                 attempt="2") == 1
    assert value("ojs_retry_exhausted_total", task=exhausted.actor_name, queue=queue) == 1
    assert value("ojs_retry_exhausted_total", task=retried.actor_name, queue=queue) is None
    assert value("ojs_dead_letter_total", queue=queue) == 1
    assert value("ojs_discarded_total", reason="non_retryable") == 1
    assert value("ojs_discarded_total", reason="fail") == 1
    assert value("ojs_discarded_total", reason="exhausted") is None
    assert value("ojs_retry_backoff_seconds_count") == 3
    assert value("ojs_retry_backoff_seconds_sum") == pytest.approx(0.02 + 0.04 + 0.02)

    # Dramatiq's own worker log prints arguments; the decision log must not.
    logged = [r for r in caplog.records if r.name == "ojs_adapters.retry"]
    assert len(logged) == 6
    assert {r.__dict__["ojs"]["correlation_id"] for r in logged} == {
        m.message_id for m in messages}
    for secret in SECRETS:
        assert all(secret not in r.getMessage() and secret not in str(r.__dict__)
                   for r in logged)


def test_a_lost_worker_is_one_event(stub_env: Env, events: list[DecisionEvent]) -> None:
    """The crash path (a redelivered running attempt) executes one decision, so one event."""
    actor = stub_env.actor(lambda: None, retry_policy={**FAST, "max_attempts": 1})
    message = crashed_attempt(stub_env, actor)
    stub_env.start()
    stub_env.broker.enqueue(message)
    assert stub_env.wait_record(message.message_id).outcome == "discarded"
    [event] = [e for e in events if e.job_id == message.message_id]
    assert (event.decision.action, event.decision.entry.code) == ("discard", "HANDLER_PANIC")
