"""The worked examples of ojs-retry.md section 12 and ojs-errors.md section 12, one test each."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from ojs_adapters import JobError, JobRecord, OjsError, OjsResourceError, RetryPolicy, decide
from ojs_adapters.failure import describe_failure

CRM = RetryPolicy.from_dict({
    "max_attempts": 5, "initial_interval": "PT30S", "backoff_coefficient": 2.0,
    "max_interval": "PT15M", "jitter": True,
    "non_retryable_errors": ["auth.invalid_credentials", "auth.account_suspended",
                             "resource.not_found", "validation.*", "external.crm.api_deprecated"],
    "on_exhaustion": "dead_letter",
})


def test_retry_12_3_payment_policy_behaviour() -> None:
    p = RetryPolicy.from_dict({
        "max_attempts": 25, "initial_interval": "PT15S", "backoff_coefficient": 4.0,
        "max_interval": "PT1H", "jitter": True, "backoff_strategy": "polynomial",
        "non_retryable_errors": ["payment.card_stolen", "payment.card_expired", "validation.*"],
        "on_exhaustion": "dead_letter"})
    assert decide(p, 1, JobError("payment.card_stolen", "")).action == "dead_letter"
    assert decide(p, 1, JobError("validation.amount", "")).action == "dead_letter"
    assert decide(p, 24, JobError("payment.gateway_down", "")).action == "retry"
    assert decide(p, 25, JobError("payment.gateway_down", "")).action == "dead_letter"
    assert all(d <= 3600 for d in (p.delay(n) for n in range(1, 25)))


def test_retry_12_4_custom_non_retryable_errors() -> None:
    assert decide(CRM, 1, JobError("auth.invalid_credentials", "401")).action == "dead_letter"
    assert decide(CRM, 1, JobError("resource.not_found", "404")).action == "dead_letter"
    d = decide(CRM, 1, JobError("external.crm.service_unavailable", "503"), jitter_sample=0.5)
    assert (d.action, d.delay) == ("retry", 30.0)
    assert CRM.schedule() == [30, 60, 120, 240]


def test_retry_12_6_no_retry_direct_to_dead_letter() -> None:
    p = RetryPolicy.from_dict({"max_attempts": 1, "on_exhaustion": "dead_letter"})
    d = decide(p, 1, RuntimeError("report failed"))
    assert (d.action, d.reason) == ("dead_letter", "exhausted")


def test_retry_12_7_handler_override_example() -> None:
    p = RetryPolicy.from_dict({"max_attempts": 3, "on_exhaustion": "dead_letter"})
    cases = [
        (JobError("payment.card_declined", "declined", code="DISCARD"), "discard"),
        (JobError("payment.card_stolen", "stolen", code="DEAD_LETTER"), "dead_letter"),
        (JobError("external.timeout", "slow", code="RETRY"), "retry"),
        (JobError("external.server_error", "500"), "retry"),  # no code: RETRY
    ]
    for error, action in cases:
        assert decide(p, 1, error).action == action


def test_errors_12_2_rate_limited_error_object() -> None:
    err = OjsResourceError("Rate limit exceeded for queue 'emails': 100 requests per minute",
                           code="RATE_LIMITED",
                           details={"queue": "emails", "limit": 100, "window": "60s",
                                    "retry_after_seconds": 30})
    body = err.to_dict()
    assert body["retryable"] is True
    assert body["doc_url"] == "https://openjobspec.org/errors/RATE_LIMITED"
    assert OjsError.from_dict(body).details["retry_after_seconds"] == 30
    # raised inside a handler, a retryable catalog error follows the policy
    assert decide(RetryPolicy(), 1, err).action == "retry"


def test_errors_12_5_history_of_a_job_retried_then_dead_lettered() -> None:
    p = RetryPolicy.from_dict({"max_attempts": 3, "initial_interval": "PT1S",
                               "max_interval": "PT60S", "on_exhaustion": "dead_letter"})
    record = JobRecord(id="019539a4-b68c-7def-8000-1a2b3c4d5e6f", type="email.send",
                       queue="emails", max_attempts=3)
    t0 = datetime(2026, 2, 15, 10, 30, tzinfo=timezone.utc)
    failures = [
        (t0, describe_failure(ConnectionRefusedError("SMTP connection refused on port 25"))),
        (t0 + timedelta(seconds=65), describe_failure(TimeoutError("Handler exceeded 30s"),
                                                      catalog_code="HANDLER_TIMEOUT")),
        (t0 + timedelta(seconds=190), describe_failure(PermissionError("SMTP auth failed"))),
    ]
    for attempt, (when, failure) in enumerate(failures, 1):
        record = record.started(attempt, now=when)
        d = decide(p, attempt, failure, now=when, jitter_sample=0.5)
        record = record.failed(d.entry, action=d.action, delay=d.delay)
    data = record.to_dict()
    assert [e["code"] for e in data["errors"]] == ["HANDLER_ERROR", "HANDLER_TIMEOUT",
                                                   "HANDLER_ERROR"]
    assert [e["attempt"] for e in data["errors"]] == [1, 2, 3]
    assert data["errors"][0]["occurred_at"] == "2026-02-15T10:30:00.000Z"
    assert (data["state"], data["dead_lettered"], data["attempt"]) == ("discarded", True, 3)
