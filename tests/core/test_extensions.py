"""Opt-in extensions (issue 10): jitter modes, max_duration, Retry-After, classification, budgets.

None of them changes the OJS defaults; each is proved against the integration
standard's rule it implements (R-1, R-3, R-4, R-5, R-6, R-7).
"""

from __future__ import annotations

import socket
import ssl
import urllib.error
from datetime import datetime, timedelta, timezone
from email.message import Message
from email.utils import format_datetime
from typing import Any

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st
from redis.backoff import NoBackoff
from redis.retry import Retry

from ojs_adapters import JobError, OjsValidationError, RetryPolicy, decide, new_idempotency_key
from ojs_adapters.classify import classify, raise_classified, retry_after_seconds
from ojs_adapters.runtime.budget import LocalRetryBudget, RedisRetryBudget

samples = st.floats(min_value=0.0, max_value=1.0, exclude_max=True)
retries = st.integers(1, 500)


def test_extensions_leave_the_ojs_defaults_alone() -> None:
    assert "jitter_mode" not in RetryPolicy().to_dict()
    assert "max_duration" not in RetryPolicy().to_dict()
    p = RetryPolicy.from_dict({"jitter_mode": "full", "max_duration": "PT1H"})
    assert p.to_dict()["jitter_mode"] == "full" and p.to_dict()["max_duration"] == "PT1H"
    assert RetryPolicy.from_dict(p.to_dict()) == p
    for bad in ({"jitter_mode": "equal"}, {"max_duration": "P1Y"}, {"max_duration": "PT0S"}):
        with pytest.raises(OjsValidationError) as info:
            RetryPolicy.from_dict(bad)
        assert info.value.details["field"] in bad


@given(retries, samples)
def test_r1_full_jitter_is_uniform_in_zero_to_capped(n: int, u: float) -> None:
    p = RetryPolicy.from_dict({"jitter_mode": "full", "max_attempts": 600})
    capped = p.capped_delay(n)
    d = p.delay(n, jitter_sample=u)
    assert 0.0 <= d <= capped and d == capped * u
    assert p.jitter_bounds(n) == (0.0, capped)


@given(retries, samples, st.floats(min_value=0.0, max_value=1000.0))
def test_decorrelated_jitter_stays_between_base_and_cap(n: int, u: float, prev: float) -> None:
    p = RetryPolicy.from_dict({"jitter_mode": "decorrelated", "initial_interval": "PT1S",
                               "max_interval": "PT5M", "max_attempts": 600})
    d = p.delay(n, jitter_sample=u, previous=prev)
    assert 1.0 <= d <= 300.0
    assert d <= max(prev, 1.0) * 3


def test_decorrelated_jitter_grows_from_the_previous_delay() -> None:
    p = RetryPolicy.from_dict({"jitter_mode": "decorrelated", "max_attempts": 10})
    assert p.delay(1, jitter_sample=0.5) == 2.0  # first: [1, 3)
    assert p.delay(2, jitter_sample=0.5, previous=10.0) == 15.5  # [1, 30)
    assert p.delay(3, jitter_sample=0.999, previous=200.0) == 300.0  # capped


def test_r3_max_duration_exhausts_a_retry_that_would_start_too_late() -> None:
    p = RetryPolicy.from_dict({"max_attempts": 10, "jitter": False, "max_duration": "PT10S",
                               "on_exhaustion": "dead_letter"})
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    first = start.timestamp()
    ok = decide(p, 3, ValueError(), now=start + timedelta(seconds=5), first_attempt_at=first)
    assert (ok.action, ok.delay) == ("retry", 4.0)
    late = decide(p, 3, ValueError(), now=start + timedelta(seconds=7), first_attempt_at=first)
    assert (late.action, late.reason, late.exhausted) == ("dead_letter", "max_duration", True)


def test_r5_retry_after_beyond_the_remaining_duration_exhausts_at_once() -> None:
    p = RetryPolicy.from_dict({"max_attempts": 10, "max_duration": "PT60S"})
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    d = decide(p, 1, JobError("http.too_many_requests", "", retry_after=120), now=start,
               first_attempt_at=start.timestamp())
    assert d.reason == "max_duration"
    d = decide(p, 1, JobError("http.too_many_requests", "", retry_after=30), now=start,
               first_attempt_at=start.timestamp())
    assert (d.action, d.delay) == ("retry", 30.0)


def test_r5_retry_after_header_values() -> None:
    now = datetime(2026, 2, 15, 10, 30, tzinfo=timezone.utc)
    assert retry_after_seconds("30") == 30.0
    assert retry_after_seconds(format_datetime(now + timedelta(seconds=90), usegmt=True),
                               now=now) == 90.0
    assert retry_after_seconds(format_datetime(now - timedelta(seconds=5), usegmt=True),
                               now=now) == 0.0
    assert retry_after_seconds("soon") is None and retry_after_seconds(None) is None


class _Response:
    def __init__(self, status: int, headers: dict[str, str] | None = None) -> None:
        self.status_code, self.headers = status, headers or {}


class HTTPStatusError(Exception):
    """Shaped like requests.HTTPError and httpx.HTTPStatusError: a .response with a status."""

    def __init__(self, status: int, headers: dict[str, str] | None = None) -> None:
        super().__init__(f"status {status}")
        self.response = _Response(status, headers)


@pytest.mark.parametrize(
    ("status", "retryable", "code"),
    [(408, True, "BACKEND_TIMEOUT"), (429, True, "RATE_LIMITED"), (500, True, "BACKEND_ERROR"),
     (502, True, "BACKEND_UNAVAILABLE"), (503, True, "BACKEND_UNAVAILABLE"),
     (504, True, "BACKEND_TIMEOUT"), (400, False, "INVALID_PAYLOAD"),
     (401, False, "UNAUTHENTICATED"), (403, False, "PERMISSION_DENIED"),
     (404, False, "NOT_FOUND"), (409, False, "DUPLICATE_JOB"),
     (422, False, "SCHEMA_VALIDATION_FAILED")],
)
def test_r4_http_statuses(status: int, retryable: bool, code: str) -> None:
    found = classify(HTTPStatusError(status))
    assert found is not None and (found.retryable, found.code, found.status) == (
        retryable, code, status)


def test_r4_urllib_http_error_and_retry_after() -> None:
    headers = Message()
    headers["Retry-After"] = "7"
    err = urllib.error.HTTPError("http://x", 429, "slow down", headers, None)
    found = classify(err)
    assert found is not None and (found.type, found.retry_after) == ("http.too_many_requests", 7.0)


class RpcError(Exception):
    """Shaped like grpc.RpcError: a .code() whose result has a .name."""

    class _Code:
        def __init__(self, name: str) -> None:
            self.name = name

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._name = name

    def code(self) -> Any:
        return self._Code(self._name)


RpcError.__module__ = "grpc._channel"


@pytest.mark.parametrize(("name", "retryable"),
                         [("UNAVAILABLE", True), ("DEADLINE_EXCEEDED", True),
                          ("RESOURCE_EXHAUSTED", True), ("ABORTED", True),
                          ("INVALID_ARGUMENT", False), ("NOT_FOUND", False),
                          ("PERMISSION_DENIED", False), ("UNAUTHENTICATED", False),
                          ("UNIMPLEMENTED", False)])
def test_r4_grpc_codes(name: str, retryable: bool) -> None:
    found = classify(RpcError(name))
    assert found is not None and found.retryable is retryable and found.status == name


@pytest.mark.parametrize(
    ("exc", "retryable", "kind"),
    [(ConnectionRefusedError(), True, "network.connection_failed"),
     (ConnectionResetError(), True, "network.connection_failed"),
     (TimeoutError(), True, "network.timeout"),
     (socket.gaierror(-2, "Name or service not known"), True, "network.dns_failure"),
     (ssl.SSLCertVerificationError("self signed"), False, "tls.certificate_error")],
)
def test_r4_r9_network_and_tls_errors(exc: BaseException, retryable: bool, kind: str) -> None:
    found = classify(exc)
    assert found is not None and (found.retryable, found.type) == (retryable, kind)


def test_raise_classified_feeds_decide() -> None:
    p = RetryPolicy.from_dict({"max_attempts": 5})
    with pytest.raises(JobError) as info:
        raise_classified(ssl.SSLCertVerificationError("mitm?"))
    assert decide(p, 1, info.value).action == "fail"
    with pytest.raises(JobError) as info:
        raise_classified(HTTPStatusError(429, {"Retry-After": "40"}))
    d = decide(p, 1, info.value)
    assert d.action == "retry" and d.delay == 40.0
    with pytest.raises(KeyError):
        raise_classified(KeyError("unknown kinds pass through"))


def test_r6_idempotency_keys_are_uuid4() -> None:
    key = new_idempotency_key()
    assert len(key) == 36 and key[14] == "4" and key != new_idempotency_key()


def test_r7_local_budget_allows_the_share_then_suppresses() -> None:
    budget = LocalRetryBudget("api", share=0.2, minimum=0)
    for _ in range(50):
        budget.record_execution()
    granted = sum(budget.allow_retry() for _ in range(20))
    assert granted == 10 and budget.utilization() == 1.0
    p = RetryPolicy.from_dict({"max_attempts": 5})
    d = decide(p, 1, ValueError(), budget=budget)
    assert (d.action, d.reason) == ("discard", "budget")


def test_r7_budget_minimum_lets_a_quiet_dependency_retry() -> None:
    budget = LocalRetryBudget("quiet", minimum=2)
    assert [budget.allow_retry() for _ in range(3)] == [True, True, False]


def test_r7_redis_budget_is_shared_and_atomic(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    name = f"test-{new_idempotency_key()}"
    one = RedisRetryBudget(client, name, share=0.25, minimum=0, prefix="ojs:test:budget")
    two = RedisRetryBudget(redis.Redis.from_url(redis_url), name, share=0.25, minimum=0,
                           prefix="ojs:test:budget")
    for budget in (one, two) * 20:
        budget.record_execution()
    granted = sum(b.allow_retry() for b in (one, two) * 10)
    assert granted == 10  # 25% of 40 executions, counted across both
    assert one.utilization() == two.utilization() == 1.0


def test_r7_redis_budget_falls_back_locally_when_redis_is_down() -> None:
    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2,
                       retry=Retry(NoBackoff(), 0))
    budget = RedisRetryBudget(dead, "x", minimum=1)
    budget.record_execution()
    assert budget.allow_retry() is True and budget.allow_retry() is False
