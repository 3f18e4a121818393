"""Decision hooks: structured logs without PII (R-9) and Prometheus metrics (R-10)."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import CollectorRegistry

from ojs_adapters import JobError, RetryPolicy, decide
from ojs_adapters.runtime.events import DecisionEvent, add_hook, emit, remove_hook
from ojs_adapters.runtime.logs import LogDecisions
from ojs_adapters.runtime.metrics import PrometheusMetrics

SECRET = "card 4242-4242-4242-4242 of alice@example.com"


def event(decision_args: tuple[RetryPolicy, int, BaseException], **kw: object) -> DecisionEvent:
    return DecisionEvent(framework="celery", job_id="job-1", task="billing.charge",
                         queue="payments", max_attempts=decision_args[0].max_attempts,
                         decision=decide(*decision_args, jitter_sample=0.5))


def test_r9_logs_carry_fields_but_never_messages_or_arguments(
        caplog: pytest.LogCaptureFixture) -> None:
    policy = RetryPolicy.from_dict({"max_attempts": 2, "on_exhaustion": "dead_letter"})
    with caplog.at_level(logging.INFO, logger="ojs_adapters.retry"):
        emit(event((policy, 1, ValueError(SECRET))))
        emit(event((policy, 2, ValueError(SECRET))))
    retry, dead = caplog.records
    assert retry.levelno == logging.INFO and dead.levelno == logging.WARNING
    fields = retry.ojs  # type: ignore[attr-defined]
    assert fields["correlation_id"] == "job-1" and fields["backoff_ms"] == 1000
    assert fields["decision"] == "retry" and fields["error_type"] == "ValueError"
    assert SECRET not in caplog.text
    assert all(SECRET not in str(r.__dict__) for r in caplog.records)


def test_messages_only_when_opted_in(caplog: pytest.LogCaptureFixture) -> None:
    hook = LogDecisions(include_messages=True)
    with caplog.at_level(logging.INFO, logger="ojs_adapters.retry"):
        hook(event((RetryPolicy(), 1, ValueError("visible"))))
    assert "visible" in caplog.text


def test_a_failing_hook_never_breaks_the_job(caplog: pytest.LogCaptureFixture) -> None:
    def broken(_: DecisionEvent) -> None:
        raise RuntimeError("hook bug")

    add_hook(broken)
    try:
        emit(event((RetryPolicy(), 1, ValueError("x"))))
    finally:
        remove_hook(broken)
    assert "hook" in caplog.text


def test_r10_prometheus_counters_after_a_scripted_run() -> None:
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry)
    policy = RetryPolicy.from_dict({"max_attempts": 3, "on_exhaustion": "dead_letter",
                                    "non_retryable_errors": ["auth.*"]})
    discard = RetryPolicy.from_dict({"max_attempts": 2})
    for args in [(policy, 1, ValueError()), (policy, 2, ValueError()), (policy, 3, ValueError()),
                 (discard, 2, ValueError()), (policy, 1, JobError("auth.x", "")),
                 (policy, 1, JobError("a.b", "", code="DISCARD")),
                 (policy, 1, JobError("a.b", "", code="FAIL"))]:
        metrics(event(args))  # type: ignore[arg-type]

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert value("ojs_retry_attempts_total", task="billing.charge", queue="payments",
                 attempt="2") == 1
    assert value("ojs_retry_attempts_total", task="billing.charge", queue="payments",
                 attempt="3") == 1
    assert value("ojs_retry_exhausted_total", task="billing.charge", queue="payments") == 2
    assert value("ojs_dead_letter_total", queue="payments") == 2
    assert value("ojs_discarded_total", reason="exhausted") == 1
    assert value("ojs_discarded_total", reason="discard") == 1
    assert value("ojs_discarded_total", reason="fail") == 1
    assert value("ojs_retry_backoff_seconds_count") == 2
