"""Celery task options to OJS (issue 6), checked against Celery's own backoff function."""

from __future__ import annotations

import pytest

from ojs_adapters import OjsValidationError
from ojs_adapters.migrate import from_celery


def test_defaults_are_three_retries_every_180_seconds() -> None:
    m = from_celery({})
    assert m.policy is not None
    assert m.policy.max_attempts == 4
    assert m.policy.schedule() == [180.0, 180.0, 180.0]
    assert m.policy.on_exhaustion == "discard"
    assert m.fidelity is not None and m.fidelity.exact
    # Without autoretry_for only self.retry() retries; under the policy every error does.
    assert any(n.field == "autoretry_for" and n.severity == "lossy" for n in m.notes)
    assert m.lossy


def test_retry_kwargs_beyond_a_count_and_a_countdown_are_reported() -> None:
    m = from_celery({"autoretry_for": ["Exception"], "retry_kwargs": {
        "max_retries": 2, "countdown": 5, "queue": "retries", "priority": 9}})
    assert m.policy is not None and m.policy.schedule() == [5.0, 5.0]
    assert {n.field for n in m.notes if n.severity == "lossy"} == {
        "retry_kwargs.priority", "retry_kwargs.queue"}
    assert m.lossy and not m.ok
    inert = from_celery({"autoretry_for": ["Exception"], "retry_kwargs": {"throw": False}})
    assert not inert.lossy  # autoretry raises whatever throw says
    with pytest.raises(OjsValidationError, match="retry_kwargs"):
        from_celery({"autoretry_for": ["Exception"], "retry_kwargs": {"exc": "x"}})
    # Without autoretry_for, retry_kwargs does nothing: self.retry() keeps the task's own.
    bare = from_celery({"retry_kwargs": {"max_retries": 10, "countdown": 5, "queue": "slow"}})
    assert bare.policy is not None and bare.policy.max_attempts == 4
    assert bare.policy.schedule() == [180.0] * 3
    assert not any(n.field == "retry_kwargs.queue" for n in bare.notes)


def test_max_retries_none_is_reported_not_silently_capped() -> None:
    m = from_celery({"max_retries": None, "autoretry_for": ["Exception"]})
    assert m.policy is None and not m.ok
    assert [n.severity for n in m.notes if n.field == "max_retries"] == ["unsupported"]
    assert m.to_dict()["policy"] is None


def test_max_retries_none_in_retry_kwargs_is_unbounded_too() -> None:
    m = from_celery({"autoretry_for": ["Exception"], "retry_kwargs": {"max_retries": None}})
    assert m.policy is None
    assert any(n.field == "retry_kwargs.max_retries" for n in m.notes)


def test_a_cap_for_unbounded_is_used_only_when_asked_and_reported_lossy() -> None:
    m = from_celery({"max_retries": None, "autoretry_for": ["Exception"]}, unbounded_attempts=50)
    assert m.policy is not None and m.policy.max_attempts == 50
    assert any(n.severity == "lossy" and n.asked and n.field == "max_retries" for n in m.notes)
    assert not m.lossy and m.ok  # the caller chose the cap: it does not fail the migration


def test_max_retries_zero_is_one_attempt() -> None:
    assert from_celery({"max_retries": 0}).policy.max_attempts == 1  # type: ignore[union-attr]


def test_retry_backoff_exponential_without_jitter_is_exact() -> None:
    m = from_celery({"autoretry_for": ["Exception"], "retry_backoff": 5, "retry_jitter": False,
                     "retry_backoff_max": 18, "max_retries": 4})
    assert m.policy is not None
    assert m.policy.schedule() == [5.0, 10.0, 18.0, 18.0]
    assert m.exact


def test_retry_backoff_true_full_jitter_halves_the_intervals_to_keep_the_means() -> None:
    m = from_celery({"autoretry_for": ["Exception"], "retry_backoff": True, "max_retries": 12})
    policy = m.policy
    assert policy is not None
    # Factor 1 s and cap 600 s with full jitter (mean countdown / 2): OJS jitter's mean is
    # the delay itself (RET-05), so the policy uses half of each to keep the expected delays.
    assert (policy.initial_interval.total_seconds(), policy.max_interval.total_seconds()) == \
        (0.5, 300.0)
    assert policy.jitter
    fidelity = m.fidelity
    assert fidelity is not None and fidelity.rows[0].ratio == pytest.approx(1.0)
    assert fidelity.worst_ratio == pytest.approx(0.875)  # at the cap: min(300 x [0.5,1.5), 300)
    assert fidelity.faithful and m.ok
    assert any("jitter_mode 'full'" in n.text for n in m.notes)


def test_fractional_retry_backoff_is_truncated_like_celery() -> None:
    m = from_celery({"autoretry_for": ["Exception"], "retry_backoff": 2.7, "retry_jitter": False})
    assert m.policy.initial_interval.total_seconds() == 2.0  # type: ignore[union-attr]


def test_retry_kwargs_countdown_and_max_retries() -> None:
    m = from_celery({"autoretry_for": ["Exception"],
                     "retry_kwargs": {"max_retries": 2, "countdown": 7}})
    assert m.policy is not None and m.policy.schedule() == [7.0, 7.0]


def test_autoretry_for_is_an_allow_list_ojs_cannot_hold() -> None:
    m = from_celery({"autoretry_for": ["requests.exceptions.ConnectionError"],
                     "dont_autoretry_for": ["ValueError"]})
    assert m.policy is not None and m.policy.non_retryable_errors == ("ValueError",)
    assert any(n.severity == "lossy" and n.field == "autoretry_for" for n in m.notes)


def test_zero_delay_becomes_one_millisecond_with_a_note() -> None:
    m = from_celery({"default_retry_delay": 0})
    assert m.policy.initial_interval.total_seconds() == 0.001  # type: ignore[union-attr]
    assert any(n.severity == "approximate" for n in m.notes)


@pytest.mark.parametrize(("opts", "field"), [
    ({"max_retries": True}, "max_retries"), ({"max_retries": -1}, "max_retries"),
    ({"retry_backoff": "yes"}, "retry_backoff"), ({"autoretry_for": [1]}, "autoretry_for"),
    ({"retry_kwargs": [1]}, "retry_kwargs"), ({"default_retry_delay": "3m"},
                                               "default_retry_delay"),
])
def test_bad_options_are_rejected(opts: dict[str, object], field: str) -> None:
    with pytest.raises(OjsValidationError) as info:
        from_celery(opts)
    assert info.value.details["field"] == field


def test_bands_match_celerys_own_backoff_function() -> None:
    time = pytest.importorskip("celery.utils.time")
    m = from_celery({"autoretry_for": ["Exception"], "retry_backoff": 3, "max_retries": 6,
                     "retry_backoff_max": 100})
    assert m.fidelity is not None
    for row in m.fidelity.rows:
        draws = [time.get_exponential_backoff_interval(3, row.retry - 1, 100, True)
                 for _ in range(400)]
        assert row.old.low <= min(draws) and max(draws) <= row.old.high
        assert sum(draws) / len(draws) == pytest.approx(row.old.mean, rel=0.2)
