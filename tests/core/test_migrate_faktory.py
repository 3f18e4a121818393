"""Faktory to OJS (issue 6): retry 25 / 0 / -1 and a missing field, by server version."""

from __future__ import annotations

import pytest

from ojs_adapters import OjsValidationError
from ojs_adapters.migrate import Band, from_faktory
from ojs_adapters.migrate.faktory import faktory_band


def _shape(options: dict[str, object], **kw: str) -> tuple[int, str]:
    policy = from_faktory(options, **kw).policy
    assert policy is not None
    return policy.max_attempts, policy.on_exhaustion


def test_default_25_retries_then_the_morgue() -> None:
    assert _shape({"retry": 25}) == (26, "dead_letter")


def test_zero_means_one_attempt_then_discarded() -> None:
    assert _shape({"retry": 0}) == (1, "discard")


def test_minus_one_means_straight_to_the_morgue() -> None:
    assert _shape({"retry": -1}) == (1, "dead_letter")


def test_missing_retry_is_discarded_on_servers_before_1_6() -> None:
    # faktory#144: a payload without "retry" unmarshals to 0 on those servers.
    assert _shape({"jobtype": "Webhook"}, version="1.5.1") == (1, "discard")


def test_missing_retry_is_the_default_on_1_6_and_later() -> None:
    # faktory#385 made the field a pointer: nil means the default policy of 25.
    m = from_faktory({"jobtype": "Webhook"})
    assert (m.policy.max_attempts, m.policy.on_exhaustion) == (26, "dead_letter")  # type: ignore[union-attr]
    assert any("1.6.0" in n.text for n in m.notes)
    assert _shape({}, version="1.6.0") == (26, "dead_letter")


def test_delay_formula_and_fidelity() -> None:
    assert faktory_band(0) == Band(15, 44, 29.5)
    assert faktory_band(2) == Band(31, 118, 74.5)
    m = from_faktory({"retry": 5})
    assert m.policy is not None and m.policy.jitter
    # Sidekiq's old formula: the closest schedule, as for Sidekiq; never before 15 s.
    assert m.fidelity is not None and len(m.fidelity.rows) == 5
    assert m.fidelity.rows[0].new.mean >= 15
    assert all(0.8 < row.ratio < 1.25 for row in m.fidelity.rows)
    assert m.ok and not m.lossy


@pytest.mark.parametrize("value", [-2, "25", True, 2.5])
def test_bad_retry_values_are_rejected(value: object) -> None:
    with pytest.raises(OjsValidationError) as info:
        from_faktory({"retry": value})
    assert info.value.details["field"] == "retry"
    assert info.value.code == "INVALID_RETRY_POLICY"
