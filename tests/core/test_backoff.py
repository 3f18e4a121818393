"""Backoff strategies, caps and jitter: every table of ojs-retry.md sections 3, 5 and 12.

RET-04 (cap), RET-05 (jitter multiplier in [0.5, 1.5)), RET-06 (cap after jitter).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ojs_adapters import OjsValidationError, RetryPolicy


def policy(**fields: Any) -> RetryPolicy:
    return RetryPolicy.from_dict(fields)


def test_section_3_1_none_constant_table() -> None:
    p = policy(initial_interval="PT5S", backoff_strategy="none", max_attempts=5, jitter=False)
    assert p.schedule() == [5, 5, 5, 5]


def test_section_3_2_linear_table() -> None:
    p = policy(initial_interval="PT5S", backoff_strategy="linear", max_attempts=5, jitter=False)
    assert p.schedule() == [5, 10, 15, 20]


def test_ret04_section_3_3_exponential_table_with_cap() -> None:
    p = policy(max_attempts=11)  # PT1S, coefficient 2.0, PT5M
    raw = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    capped = [1, 2, 4, 8, 16, 32, 64, 128, 256, 300]
    assert [min(r, 300) for r in raw] == capped
    assert p.schedule() == capped


def test_ret04_section_3_4_polynomial_table_with_cap() -> None:
    p = policy(backoff_strategy="polynomial", backoff_coefficient=4.0, max_attempts=6)
    assert p.schedule() == [1, 16, 81, 256, 300]


def test_section_5_3_jitter_table_bounds() -> None:
    p = policy(initial_interval="PT10S", max_attempts=7)
    expected = [(5, 15), (10, 30), (20, 60), (40, 120), (80, 240), (150, 300)]
    assert [p.jitter_bounds(n) for n in range(1, 7)] == expected
    assert p.schedule() == [10, 20, 40, 80, 160, 300]


def test_section_12_2_default_policy_delays() -> None:
    assert RetryPolicy().schedule() == [1, 2]


def test_section_12_3_polynomial_sidekiq_like_schedule() -> None:
    p = policy(max_attempts=25, initial_interval="PT15S", backoff_coefficient=4.0,
               max_interval="PT1H", backoff_strategy="polynomial")
    schedule = p.schedule()
    assert len(schedule) == 24
    assert schedule[:5] == [15, 240, 1215, 3600, 3600]
    assert [15 * n**4 for n in range(1, 6)] == [15, 240, 1215, 3840, 9375]


def test_section_12_5_constant_polling_schedule() -> None:
    p = policy(max_attempts=60, initial_interval="PT10S", backoff_coefficient=1.0,
               max_interval="PT10S", jitter=False)
    assert p.schedule() == [10.0] * 59
    assert sum(p.schedule()) == 590


def test_coefficient_one_with_exponential_is_constant() -> None:
    assert policy(backoff_coefficient=1.0, max_attempts=5).schedule() == [1, 1, 1, 1]


def test_ret05_jitter_multiplier_endpoints() -> None:
    p = policy(initial_interval="PT10S")
    assert p.delay(1, jitter_sample=0.0) == 5.0
    assert p.delay(1, jitter_sample=0.5) == 10.0
    assert p.delay(1, jitter_sample=0.999) == pytest.approx(14.99)


def test_ret06_cap_applies_again_after_jitter() -> None:
    p = policy(initial_interval="PT10S", max_attempts=7)
    assert p.delay(6, jitter_sample=0.999) == 300.0
    assert p.delay(6, jitter_sample=0.0) == 150.0


def test_jitter_off_ignores_the_sample() -> None:
    p = policy(jitter=False)
    assert p.delay(2, jitter_sample=0.0) == 2.0
    assert p.delay(2) == 2.0


def test_no_overflow_for_retry_10000_with_coefficient_10() -> None:
    for strategy in ("exponential", "polynomial", "linear"):
        p = policy(backoff_coefficient=10.0, backoff_strategy=strategy, max_attempts=10_001)
        assert p.delay(10_000, jitter_sample=0.7) == 300.0
        assert p.capped_delay(10_000) == 300.0


@pytest.mark.parametrize("bad", [0, -1, 1.0, True, "1"])
def test_delay_rejects_bad_retry_numbers(bad: Any) -> None:
    with pytest.raises(OjsValidationError) as info:
        RetryPolicy().delay(bad)
    assert info.value.details["field"] == "retry"


@pytest.mark.parametrize("bad", [-0.1, 1.0, 1.5, float("nan")])
def test_delay_rejects_jitter_samples_outside_0_1(bad: float) -> None:
    with pytest.raises(OjsValidationError) as info:
        RetryPolicy().delay(1, jitter_sample=bad)
    assert info.value.details["field"] == "jitter_sample"


strategies = st.sampled_from(["none", "linear", "exponential", "polynomial"])
coefficients = st.floats(min_value=1.0, max_value=20.0)
initials = st.sampled_from(["PT0.001S", "PT0.1S", "PT1S", "PT15S", "PT1M"])
maxima = st.sampled_from(["PT1M", "PT5M", "PT1H", "P1D"])
samples = st.floats(min_value=0.0, max_value=1.0, exclude_max=True)


@given(strategies, coefficients, initials, maxima, st.integers(1, 5000))
def test_raw_delays_are_monotone_non_decreasing(
    strategy: str, coefficient: float, initial: str, maximum: str, n: int
) -> None:
    p = policy(backoff_strategy=strategy, backoff_coefficient=coefficient,
               initial_interval=initial, max_interval=maximum)
    assert p.capped_delay(n) <= p.capped_delay(n + 1)


@given(strategies, coefficients, initials, maxima, st.integers(1, 20000), samples)
def test_ret04_ret06_cap_holds_after_jitter_and_delay_never_negative(
    strategy: str, coefficient: float, initial: str, maximum: str, n: int, u: float
) -> None:
    p = policy(backoff_strategy=strategy, backoff_coefficient=coefficient,
               initial_interval=initial, max_interval=maximum)
    d = p.delay(n, jitter_sample=u)
    assert 0.0 <= d <= p.max_interval.total_seconds()
    assert math.isfinite(d)


@given(strategies, coefficients, initials, maxima, st.integers(1, 200), samples)
def test_ret05_jitter_within_half_to_one_and_a_half_of_capped_delay(
    strategy: str, coefficient: float, initial: str, maximum: str, n: int, u: float
) -> None:
    p = policy(backoff_strategy=strategy, backoff_coefficient=coefficient,
               initial_interval=initial, max_interval=maximum)
    capped = p.capped_delay(n)
    d = p.delay(n, jitter_sample=u)
    assert 0.5 * capped <= d < 1.5 * capped or d == p.max_interval.total_seconds()
    assert d == pytest.approx(min(capped * (0.5 + u), p.max_interval.total_seconds()),
                              rel=1e-12)


@given(st.integers(1, 100))
def test_random_jitter_draws_stay_in_bounds(n: int) -> None:
    p = policy(max_attempts=101)
    low, high = p.jitter_bounds(n)
    for _ in range(20):
        assert low <= p.delay(n) <= high
