"""Dramatiq actor options to OJS (issue 6), checked against Dramatiq's Retries defaults."""

from __future__ import annotations

import pytest

from ojs_adapters import OjsValidationError
from ojs_adapters.migrate import Band, from_dramatiq
from ojs_adapters.migrate.dramatiq import (
    DEFAULT_MAX_BACKOFF_MS,
    DEFAULT_MAX_RETRIES,
    DEFAULT_MIN_BACKOFF_MS,
    dramatiq_band,
)


def test_defaults_match_dramatiqs_retries_middleware() -> None:
    retries = pytest.importorskip("dramatiq.middleware.retries")
    assert DEFAULT_MIN_BACKOFF_MS == retries.DEFAULT_MIN_BACKOFF == 15_000
    assert DEFAULT_MAX_BACKOFF_MS == retries.DEFAULT_MAX_BACKOFF == 7 * 86_400_000
    assert DEFAULT_MAX_RETRIES == retries.Retries().max_retries == 20


def test_defaults_translate_to_21_attempts_15s_to_7_days_dead_letter() -> None:
    m = from_dramatiq({})
    policy = m.policy
    assert policy is not None
    assert policy.max_attempts == 21
    # Dramatiq's factor [1, 2) has mean 1.5; OJS jitter's mean is 1: 1.5 x 15 s keeps the mean.
    assert policy.initial_interval.total_seconds() == 22.5
    assert policy.max_interval.total_seconds() == 7 * 86_400
    assert policy.on_exhaustion == "dead_letter"
    assert policy.schedule()[:3] == [22.5, 45.0, 90.0]
    assert m.fidelity is not None and m.fidelity.faithful and m.ok
    short = from_dramatiq({"max_retries": 3, "min_backoff": 1000}).fidelity
    assert short is not None and short.window_ratio == pytest.approx(1.0)


def test_band_matches_dramatiqs_compute_backoff() -> None:
    common = pytest.importorskip("dramatiq.common")
    for retries, min_ms, max_ms in ((0, 15_000, DEFAULT_MAX_BACKOFF_MS), (3, 1000, 10_000),
                                    (2, 1000, 6_000), (5, 1000, 10_000)):
        band = dramatiq_band(retries, min_ms=min_ms, max_ms=max_ms)
        draws = [common.compute_backoff(retries, factor=min_ms, max_backoff=max_ms)[1] / 1000
                 for _ in range(600)]
        assert band.low - 0.001 <= min(draws) and max(draws) <= band.high
        assert sum(draws) / len(draws) == pytest.approx(band.mean, rel=0.1)


def test_band_shapes() -> None:
    assert dramatiq_band(0, min_ms=1000, max_ms=60_000) == Band(1.0, 2.0, 1.5)
    assert dramatiq_band(10, min_ms=1000, max_ms=60_000) == Band(30.0, 60.0, 45.0)


def test_dramatiq_1x_draws_half_to_all_of_the_capped_delay() -> None:
    """Before 2.0 (``compute_backoff`` up to 1.18) the delay was [0.5, 1) x min(min * 2**r,
    max); the 2.x model would double every expected delay and still call it faithful."""

    def compute_backoff_1x(retries: int, *, factor: int, max_backoff: int,
                           draw: float) -> float:  # Dramatiq 1.18's formula, draw in [0, 1)
        backoff = min(factor * 2 ** retries, max_backoff) / 2
        return int(backoff + draw * backoff) / 1000

    for retries, min_ms, max_ms in ((0, 1000, 60_000), (3, 1000, 5_000), (10, 15_000, 10**9)):
        band = dramatiq_band(retries, min_ms=min_ms, max_ms=max_ms, before_2=True)
        draws = [compute_backoff_1x(retries, factor=min_ms, max_backoff=max_ms, draw=i / 1000)
                 for i in range(1000)]
        assert band.low - 0.001 <= min(draws) and max(draws) <= band.high
        assert sum(draws) / len(draws) == pytest.approx(band.mean, rel=0.01)
    old = from_dramatiq({"max_retries": 3, "min_backoff": 1000}, version="1.17")
    assert old.policy is not None and old.policy.schedule() == [0.75, 1.5, 3.0]
    assert old.fidelity is not None and old.fidelity.window_ratio == pytest.approx(1.0)
    assert not any(n.field == "version" for n in old.notes)
    assert any(n.field == "version" for n in from_dramatiq({}).notes)  # 2.x assumed, said
    with pytest.raises(OjsValidationError, match="version"):
        from_dramatiq({}, version="latest")


def test_throws_become_non_retryable() -> None:
    m = from_dramatiq({"throws": ["ValueError", "myapp.Fatal"]})
    assert m.policy.non_retryable_errors == ("ValueError", "myapp.Fatal")  # type: ignore[union-attr]


def test_retry_when_is_code_and_gets_no_policy_without_a_cap() -> None:
    m = from_dramatiq({"retry_when": "should_retry"})
    assert m.policy is None
    assert [n.severity for n in m.notes if n.field == "retry_when"] == ["unsupported"]
    capped = from_dramatiq({"retry_when": "should_retry"}, unbounded_attempts=5)
    assert capped.policy is not None and capped.policy.max_attempts == 5


def test_max_retries_none_is_unbounded_and_reported() -> None:
    assert from_dramatiq({"max_retries": None}).policy is None


def test_max_backoff_over_7_days_is_clamped() -> None:
    m = from_dramatiq({"max_backoff": 30 * 86_400_000})
    assert m.policy.max_interval.total_seconds() == 7 * 86_400  # type: ignore[union-attr]
    assert any(n.field == "max_backoff" for n in m.notes)


def test_zero_retries_and_zero_backoff() -> None:
    assert from_dramatiq({"max_retries": 0}).policy.max_attempts == 1  # type: ignore[union-attr]
    m = from_dramatiq({"min_backoff": 0, "max_retries": 2})
    assert m.policy.initial_interval.total_seconds() == 0.001  # type: ignore[union-attr]


@pytest.mark.parametrize(("opts", "field"), [
    ({"max_retries": "x"}, "max_retries"), ({"min_backoff": -1}, "min_backoff"),
    ({"throws": "not a list"}, None),
])
def test_bad_options(opts: dict[str, object], field: str | None) -> None:
    if field is None:  # a single name is accepted as a list of one
        assert from_dramatiq(opts).policy is not None
        return
    with pytest.raises(OjsValidationError) as info:
        from_dramatiq(opts)
    assert info.value.details["field"] == field
