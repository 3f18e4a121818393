"""The framework-free parts of issue 11: backend-error retries (ERR-016) and delivery verdicts."""

from __future__ import annotations

import json

import pytest

from ojs_adapters import ErrorEntry, JobRecord, OjsBackendError
from ojs_adapters.runtime.backend_retry import FAILURES_REGISTRY, BackendRetry, backend_error
from ojs_adapters.runtime.handoff import error_headers, handed_off, judge_delivery


class FakeRedisConnectionError(Exception):
    """Named like redis-py's, so classification by name is exercised without redis."""


FakeRedisConnectionError.__name__ = "ConnectionError"


@pytest.mark.parametrize(("exc", "code"), [
    (ConnectionRefusedError(), "BACKEND_UNAVAILABLE"),
    (FakeRedisConnectionError(), "BACKEND_UNAVAILABLE"),
    (TimeoutError(), "BACKEND_TIMEOUT"),
    (type("NackError", (Exception,), {})(), "BACKEND_ERROR"),
])
def test_err016_broker_failures_are_backend_errors(exc: Exception, code: str) -> None:
    error = backend_error(exc, operation="publish retry")
    assert error is not None and (error.code, error.retryable) == (code, True)
    assert backend_error(KeyError("x")) is None


def test_err016_five_tries_from_100ms_with_exponential_backoff_and_jitter() -> None:
    waits: list[float] = []
    calls: list[int] = []

    def down() -> None:
        calls.append(1)
        raise ConnectionResetError("reset")

    before = FAILURES_REGISTRY["t:gave_up"]
    with pytest.raises(OjsBackendError) as info:
        BackendRetry(sleep=waits.append).call(down, operation="t")
    assert len(calls) == 5 and len(waits) == 4
    for n, wait in enumerate(waits):
        assert 0.1 * 2 ** n * 0.5 <= wait < 0.1 * 2 ** n * 1.5
    assert info.value.details["tries"] == 5 and info.value.code == "BACKEND_UNAVAILABLE"
    assert FAILURES_REGISTRY["t:gave_up"] == before + 1
    assert BackendRetry(tries=3, initial=0.5, jitter=False).delays() == [0.5, 1.0]


def test_err016_a_non_backend_error_is_not_retried() -> None:
    calls: list[int] = []

    def broken() -> None:
        calls.append(1)
        raise TypeError("not serializable")

    with pytest.raises(TypeError):
        BackendRetry(sleep=lambda s: None).call(broken, operation="t")
    assert calls == [1]


def test_err008_headers_carry_code_message_details_attempt_and_never_arguments() -> None:
    entry = ErrorEntry(2, "NON_RETRYABLE_ERROR", "payment.card_stolen", "stolen",
                       "2026-02-15T10:30:00.000Z", "DEAD_LETTER", {"gateway": "acme"})
    headers = error_headers(entry, 2)
    assert headers["x-ojs-error-code"] == "NON_RETRYABLE_ERROR"
    assert headers["x-ojs-attempt"] == 2
    assert json.loads(headers["x-ojs-error-details"]) == {
        "type": "payment.card_stolen", "attempt": 2, "occurred_at": "2026-02-15T10:30:00.000Z",
        "handler_code": "DEAD_LETTER", "details": {"gateway": "acme"}}


def test_idempotent_handoff_verdicts() -> None:
    entry = ErrorEntry(1, "HANDLER_ERROR", "ValueError", "x", "2026-02-15T10:30:00.000Z")
    waiting = JobRecord("j", "t", "q", 3).started(1).failed(entry, action="retry", delay=1.0)
    assert judge_delivery(waiting, 2) == "run"                      # the retry itself
    assert judge_delivery(waiting, 2, claim="other") == "duplicate"  # its second copy
    assert judge_delivery(waiting, 1) == "resend"                   # original back, not marked
    assert judge_delivery(handed_off(waiting), 1) == "duplicate"    # original back, retry landed
    assert judge_delivery(waiting.started(2), 2, claim="mine") == "lost"  # its worker died
    assert judge_delivery(waiting, 2, claim="mine") == "lost"       # ran while the store was down
    dead = JobRecord("j", "t", "q", 1).started(1).failed(entry, action="dead_letter")
    assert judge_delivery(dead, 1) == "redo_dead_letter"
    assert judge_delivery(handed_off(dead), 1) == "duplicate"


def test_rounds_rank_above_attempts() -> None:
    """A replacement (``Task.replace``) and a replayed dead letter start a new round: its
    attempt 1 runs over any attempt of the round before, and a late copy of the round
    before (the replaced message redelivered, its ack lost) is a duplicate, not a crash."""
    reset = JobRecord("j", "t", "q", 3, attempt=0, extra={"replaced_task_nesting": 1})
    assert judge_delivery(reset, 1, rounds=(1, 0)) == "run"
    assert judge_delivery(reset, 2, claim="mine", rounds=(0, 0)) == "duplicate"
    assert judge_delivery(reset.started(1), 3, claim="mine") == "duplicate"
    replayed = JobRecord("j", "t", "q", 3, attempt=0, extra={"replay_count": 1})
    assert judge_delivery(replayed, 1, rounds=(0, 1)) == "run"
    assert judge_delivery(replayed, 3) == "duplicate"  # a stale retry of the first round
    assert judge_delivery(replayed, 1, rounds=(1, 0)) == "run"  # a replacement after it
