"""BullMQ, Temporal and the Go queue dialect to OJS (issue 6)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ojs_adapters import OjsValidationError
from ojs_adapters.migrate import from_bullmq, from_queue_backoff, from_temporal

# -- BullMQ ---------------------------------------------------------------------------


def test_bullmq_default_is_a_single_attempt_kept_in_the_failed_set() -> None:
    m = from_bullmq({})
    assert (m.policy.max_attempts, m.policy.on_exhaustion) == (1, "dead_letter")  # type: ignore[union-attr]


def test_bullmq_attempts_count_every_run_like_ojs() -> None:
    m = from_bullmq({"attempts": 4, "backoff": {"type": "exponential", "delay": 1000}})
    assert m.policy is not None
    assert m.policy.max_attempts == 4
    assert m.policy.schedule() == [1.0, 2.0, 4.0]
    assert m.exact


@pytest.mark.parametrize(("attempts", "says"), [
    (20, "so it never binds"), (200, "binds from retry 31")])
def test_bullmq_cap_note_says_whether_it_binds(attempts: int, says: str) -> None:
    """1 s doubling passes the longest max_interval written (10^9 s) at retry 31."""
    m = from_bullmq({"attempts": attempts, "backoff": {"type": "exponential", "delay": 1000}})
    [note] = [n for n in m.notes if "no delay cap" in n.text]
    assert note.text.endswith(says)
    assert m.policy is not None and m.policy.schedule()[29:31] == [2.0 ** 29, 10.0 ** 9][
        :len(m.policy.schedule()[29:31])]


def test_bullmq_fixed_backoff_as_a_number() -> None:
    assert from_bullmq({"attempts": 3, "backoff": 5000}).policy.schedule() == [5.0, 5.0]  # type: ignore[union-attr]


def test_bullmq_without_backoff_retries_at_once() -> None:
    m = from_bullmq({"attempts": 3})
    assert m.policy.schedule() == [0.001, 0.001]  # type: ignore[union-attr]
    assert any(n.severity == "approximate" for n in m.notes)


def test_bullmq_jitter_and_remove_on_fail() -> None:
    m = from_bullmq({"attempts": 2, "backoff": {"type": "fixed", "delay": 1000, "jitter": 0.5},
                     "removeOnFail": True})
    assert m.policy is not None and m.policy.on_exhaustion == "discard"
    assert m.fidelity is not None and m.fidelity.rows[0].old.low == 0.5
    assert any(n.field == "backoff.jitter" for n in m.notes)


def test_bullmq_custom_strategy_is_reported() -> None:
    m = from_bullmq({"attempts": 3, "backoff": {"type": "myStrategy"}})
    assert m.policy is None
    assert [n.severity for n in m.notes if n.field == "backoff.type"] == ["unsupported"]


@pytest.mark.parametrize("opts", [{"attempts": "3"}, {"attempts": -1}, {"backoff": "fast"},
                                  {"backoff": {"type": "fixed", "jitter": 2}}])
def test_bullmq_bad_options(opts: dict[str, object]) -> None:
    with pytest.raises(OjsValidationError):
        from_bullmq(opts)


# -- Temporal -------------------------------------------------------------------------


def test_temporal_unlimited_attempts_has_no_ojs_equivalent() -> None:
    m = from_temporal({"initialInterval": "1s"})
    assert m.policy is None
    assert [n.severity for n in m.notes if n.field == "maximumAttempts"] == ["unsupported"]
    assert from_temporal({}, unbounded_attempts=10).policy.max_attempts == 10  # type: ignore[union-attr]


def test_temporal_defaults_and_camel_case() -> None:
    m = from_temporal({"maximumAttempts": 5, "nonRetryableErrorTypes": ["CardStolen"]})
    policy = m.policy
    assert policy is not None
    assert policy.initial_interval.total_seconds() == 1.0
    assert policy.max_interval.total_seconds() == 100.0  # 100 x initialInterval
    assert policy.backoff_coefficient == 2.0
    assert policy.non_retryable_errors == ("CardStolen",)
    assert not policy.jitter and m.fidelity is not None and m.fidelity.exact


def test_temporal_snake_case_and_duration_spellings() -> None:
    a = from_temporal({"initial_interval": "1m30s", "maximum_attempts": 3,
                       "maximum_interval": "PT10M"}).policy
    b = from_temporal({"initialInterval": "90s", "maximumAttempts": 3,
                       "maximumInterval": 600000}).policy
    assert a == b
    assert a is not None and a.initial_interval.total_seconds() == 90


@pytest.mark.parametrize(("opts", "field"), [
    ({"maximumAttempts": 3, "backoffCoefficient": 0.5}, "backoffCoefficient"),
    ({"maximumAttempts": 3, "initialInterval": "10s", "maximumInterval": "1s"},
     "maximumInterval"),
    ({"maximumAttempts": 3, "initialInterval": "soon"}, "initialInterval"),
    ({"maximumAttempts": -1}, "maximumAttempts"),
])
def test_temporal_bad_policies(opts: dict[str, object], field: str) -> None:
    with pytest.raises(OjsValidationError) as info:
        from_temporal(opts)
    assert info.value.details["field"] == field


@settings(max_examples=60, deadline=None)
@given(initial_ms=st.integers(1, 60_000), coefficient=st.floats(1.0, 4.0),
       factor=st.integers(1, 200), attempts=st.integers(1, 30))
def test_temporal_schedule_round_trips_exactly(initial_ms: int, coefficient: float,
                                               factor: int, attempts: int) -> None:
    coefficient = round(coefficient, 3)
    m = from_temporal({"initialInterval": f"{initial_ms}ms", "backoffCoefficient": coefficient,
                       "maximumInterval": f"{initial_ms * factor}ms",
                       "maximumAttempts": attempts})
    assert m.policy is not None and m.fidelity is not None
    expected = [min(initial_ms / 1000 * coefficient ** (n - 1), initial_ms * factor / 1000)
                for n in range(1, attempts)]
    assert m.policy.schedule() == pytest.approx(expected)
    assert m.fidelity.exact


# -- the Go queue (spec/queue-retry-backoff.md) ----------------------------------------


def test_queue_defaults_count_retries_with_full_jitter() -> None:
    m = from_queue_backoff({})
    policy = m.policy
    assert policy is not None
    assert policy.max_attempts == 4  # MaxRetries 3 counts retries
    # Full jitter's mean is half the delay, OJS jitter's is the delay: half the base and cap.
    assert policy.schedule() == [0.25, 0.5, 1.0]
    assert policy.max_interval.total_seconds() == 15.0
    assert policy.on_exhaustion == "dead_letter"
    assert m.fidelity is not None and m.fidelity.rows[0].old.low == 0.0
    assert m.fidelity.worst_ratio == pytest.approx(1.0) and not m.fidelity.exact
    assert m.ok


def test_queue_documented_configurations() -> None:
    conservative = from_queue_backoff({"MaxRetries": 5, "RetryBackoffBaseMS": 1000,
                                       "RetryBackoffMaxMS": 60000}).policy
    assert conservative is not None
    assert conservative.schedule() == [0.5, 1.0, 2.0, 4.0, 8.0]
    aggressive = from_queue_backoff({"MaxRetries": 2, "RetryBackoffBaseMS": 100,
                                     "RetryBackoffMaxMS": 5000}).policy
    assert aggressive is not None and aggressive.schedule() == [0.05, 0.1]
    assert from_queue_backoff({"MaxRetries": 0}).policy.max_attempts == 1  # type: ignore[union-attr]


def test_queue_snake_case_and_bad_values() -> None:
    assert from_queue_backoff({"max_retries": 1}).policy.max_attempts == 2  # type: ignore[union-attr]
    with pytest.raises(OjsValidationError) as info:
        from_queue_backoff({"MaxRetries": -1})
    assert info.value.details["field"] == "MaxRetries"


def test_absurdly_long_bullmq_delays_are_capped_with_a_lossy_note() -> None:
    """Found by the CLI fuzz test: 8.64e16 ms overflowed timedelta (exit 70)."""
    from ojs_adapters.migrate import from_bullmq

    once = from_bullmq({"backoff": 8.64e16})
    assert once.policy is not None
    many = from_bullmq({"attempts": 3, "backoff": 8.64e16})
    assert many.policy is not None
    assert many.policy.initial_interval.total_seconds() == 10**9
    assert any(n.severity == "lossy" for n in many.notes)
