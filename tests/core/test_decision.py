"""The decision engine (ojs-retry.md sections 6, 7, 9.2; RET-01, RET-07, RET-08, RET-17, RET-18)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ojs_adapters import (
    JobError,
    OjsAuthError,
    OjsBackendError,
    OjsError,
    OjsResourceError,
    OjsValidationError,
    RetryPolicy,
    decide,
)
from ojs_adapters.failure import Failure, describe_failure, error_type_of


def policy(**fields: Any) -> RetryPolicy:
    return RetryPolicy.from_dict(fields)


class PaymentError(Exception):
    ojs_error_type = "payment.error"


class CardStolen(PaymentError):
    ojs_error_type = "payment.card_stolen"


class Boom(RuntimeError):
    pass


def test_retry_with_exact_delay_for_the_sample() -> None:
    d = decide(RetryPolicy(), 1, ValueError("x"), jitter_sample=0.25)
    assert (d.action, d.reason, d.delay, d.jitter_sample) == ("retry", "retry", 0.75, 0.25)
    assert d.next_attempt == 2 and not d.terminal and d.outcome is None
    assert d.delay == RetryPolicy().delay(1, jitter_sample=d.jitter_sample)


def test_drawn_jitter_is_recorded_so_the_delay_can_be_recomputed() -> None:
    p = policy(max_attempts=10)
    for attempt in range(1, 10):
        d = decide(p, attempt, ValueError("x"))
        assert d.jitter_sample is not None
        assert d.delay == p.delay(attempt, jitter_sample=d.jitter_sample)


@pytest.mark.parametrize("max_attempts", [0, 1])
def test_ret01_max_attempts_zero_and_one_never_retry(max_attempts: int) -> None:
    d = decide(policy(max_attempts=max_attempts), 1, ValueError("x"))
    assert (d.action, d.reason) == ("discard", "exhausted")


@given(st.integers(0, 40), st.integers(1, 60))
def test_ret01_max_attempts_is_an_exact_upper_bound(max_attempts: int, attempt: int) -> None:
    d = decide(policy(max_attempts=max_attempts), attempt, ValueError("x"), jitter_sample=0.1)
    assert (d.action == "retry") == (attempt < max_attempts)


def test_ret17_exhaustion_follows_on_exhaustion() -> None:
    assert decide(policy(max_attempts=3), 3, ValueError()).action == "discard"
    d = decide(policy(max_attempts=3, on_exhaustion="dead_letter"), 3, ValueError())
    assert (d.action, d.outcome, d.exhausted) == ("dead_letter", "dead_letter", True)


def test_ret08_handler_codes_take_precedence() -> None:
    p = policy(max_attempts=5, on_exhaustion="dead_letter", non_retryable_errors=["a.*"])
    cases = {"DISCARD": "discard", "FAIL": "fail", "DEAD_LETTER": "dead_letter"}
    for code, action in cases.items():
        d = decide(p, 1, JobError("a.b", "m", code=code))  # type: ignore[arg-type]
        assert (d.action, d.reason, d.entry.handler_code) == (action, "handler_code", code)
    d = decide(policy(max_attempts=5), 1, JobError("x.y", "m", code="DISCARD"))
    assert d.outcome == "discarded"
    assert decide(p, 1, JobError("x.y", "m", code="FAIL")).outcome == "failed"


def test_ret08_dead_letter_code_dead_letters_even_with_discard_policy() -> None:
    d = decide(policy(on_exhaustion="discard"), 1, JobError("x.y", "m", code="DEAD_LETTER"))
    assert d.action == "dead_letter"


def test_ret08_retry_code_follows_the_normal_policy() -> None:
    p = policy(max_attempts=2, non_retryable_errors=["payment.card_declined"])
    assert decide(p, 1, JobError("external.timeout", "t", code="RETRY")).action == "retry"
    assert decide(p, 2, JobError("external.timeout", "t", code="RETRY")).action == "discard"
    non_retryable = decide(p, 1, JobError("payment.card_declined", "t", code="RETRY"))
    assert non_retryable.reason == "non_retryable"


@pytest.mark.parametrize(
    ("error_type", "matches"),
    [("validation.payload_invalid", True), ("validation.schema_error", False),
     ("auth.token_expired", True), ("auth.forbidden", True), ("auth", False),
     ("external.auth.failure", False)],
)
def test_ret07_ret18_section_6_2_matching_table(error_type: str, matches: bool) -> None:
    p = policy(non_retryable_errors=["validation.payload_invalid", "auth.*"], max_attempts=5)
    assert p.matches_non_retryable(error_type) is matches
    d = decide(p, 1, JobError(error_type, "m"))
    assert (d.action != "retry") is matches
    if matches:
        assert (d.reason, d.entry.code) == ("non_retryable", "NON_RETRYABLE_ERROR")


def test_ret07_non_retryable_match_follows_on_exhaustion() -> None:
    p = policy(non_retryable_errors=["payment.card_stolen"], on_exhaustion="dead_letter",
               max_attempts=25)
    d = decide(p, 1, CardStolen("stolen"))
    assert (d.action, d.matched, d.entry.type) == ("dead_letter", "payment.card_stolen",
                                                    "payment.card_stolen")


def test_non_retryable_matches_python_class_paths_and_base_classes() -> None:
    p = policy(non_retryable_errors=["LookupError"], max_attempts=5)
    assert decide(p, 1, KeyError("k")).reason == "non_retryable"
    assert decide(p, 1, ValueError("k")).action == "retry"
    path = f"{Boom.__module__}.Boom"
    assert decide(policy(non_retryable_errors=[path]), 1, Boom()).reason == "non_retryable"
    assert decide(policy(non_retryable_errors=["payment.error"]), 1,
                  CardStolen()).reason == "non_retryable"
    assert decide(policy(non_retryable_errors=["payment.*"]), 1,
                  CardStolen()).reason == "non_retryable"


def test_error_type_of_python_exceptions() -> None:
    assert error_type_of(ValueError) == "ValueError"
    assert error_type_of(CardStolen) == "payment.card_stolen"
    assert error_type_of(Boom) == f"{Boom.__module__}.Boom"
    assert describe_failure(Boom("x")).names[:2] == (f"{Boom.__module__}.Boom", "RuntimeError")


def test_section_9_2_stalled_attempts_ignore_non_retryable_and_consume_an_attempt() -> None:
    p = policy(non_retryable_errors=["ojs.*"], max_attempts=3, on_exhaustion="dead_letter")
    lost = Failure.worker_lost()
    d1 = decide(p, 1, lost, jitter_sample=0.5)
    assert (d1.action, d1.entry.code, d1.delay) == ("retry", "HANDLER_PANIC", 1.0)
    assert decide(p, 3, lost).action == "dead_letter"
    # a handler that declared itself FAIL still fails, even if stalled later
    timeout = describe_failure(TimeoutError("slow"), catalog_code="HANDLER_TIMEOUT")
    assert decide(p, 1, timeout).entry.code == "HANDLER_TIMEOUT"


@pytest.mark.parametrize(
    "error",
    [OjsValidationError("bad", code="INVALID_ARGS"),
     OjsAuthError("no", code="TOKEN_EXPIRED", retryable=True),
     OjsResourceError("gone", code="NOT_FOUND"),
     OjsError("custom", code="ACME_CREDIT_CHECK_FAILED")],
)
def test_err014_err015_non_retryable_catalog_errors_are_not_retried(error: OjsError) -> None:
    d = decide(policy(max_attempts=5), 1, error)
    assert (d.action, d.reason, d.entry.code) == ("discard", "not_retryable_code", error.code)


@pytest.mark.parametrize(
    "error",
    [OjsBackendError("redis down", code="BACKEND_UNAVAILABLE"),
     OjsResourceError("slow down", code="RATE_LIMITED"),
     OjsError("custom", code="ACME_FLAKY", retryable=True)],
)
def test_retryable_catalog_errors_follow_the_policy(error: OjsError) -> None:
    d = decide(policy(max_attempts=5), 1, error)
    assert d.action == "retry" and d.entry.code == error.code


def test_err012_entry_has_required_fields() -> None:
    now = datetime(2026, 2, 15, 10, 30, tzinfo=timezone.utc)
    d = decide(RetryPolicy(), 2, JobError("smtp.refused", "refused", details={"port": 25}),
               now=now)
    entry = d.entry.to_dict()
    assert entry == {
        "attempt": 2, "code": "HANDLER_ERROR", "type": "smtp.refused", "message": "refused",
        "occurred_at": "2026-02-15T10:30:00.000Z", "timestamp": "2026-02-15T10:30:00.000Z",
        "details": {"port": 25},
    }


def test_retry_after_lengthens_the_delay_only() -> None:
    p = policy(jitter=False, max_attempts=5)
    assert decide(p, 1, JobError("rate.limited", "", retry_after=30)).delay == 30.0
    assert decide(p, 3, JobError("rate.limited", "", retry_after=0.5)).delay == 4.0


@pytest.mark.parametrize("attempt", [0, -1, 1.5, True, "1"])
def test_decide_rejects_bad_attempt_numbers(attempt: Any) -> None:
    with pytest.raises(OjsValidationError) as info:
        decide(RetryPolicy(), attempt, ValueError())
    assert info.value.details["field"] == "attempt"


def test_job_error_validates_its_fields() -> None:
    with pytest.raises(OjsValidationError) as info:
        JobError("x.y", "m", code="KILL")  # type: ignore[arg-type]
    assert info.value.details["field"] == "code"
    with pytest.raises(OjsValidationError):
        JobError("", "m")
    with pytest.raises(OjsValidationError):
        JobError("x.y", retry_after=-1)


def test_job_error_pickles_with_its_fields() -> None:
    import pickle

    err = pickle.loads(pickle.dumps(JobError("a.b", "m", code="FAIL", details={"k": 1})))
    assert (err.type, err.message, err.code, err.details) == ("a.b", "m", "FAIL", {"k": 1})


def test_an_exception_whose_str_raises_is_still_described() -> None:
    class Nasty(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    d = decide(RetryPolicy(), 1, Nasty())
    assert d.entry.message == "Nasty"
