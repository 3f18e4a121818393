"""RetryPolicy: defaults, merging, validation, durations (ojs-retry.md 2, 4, 8, 11, 14)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ojs_adapters import OjsValidationError, RetryPolicy
from ojs_adapters.durations import format_duration, parse_duration
from ojs_adapters.policy import DEFAULT_POLICY
from ojs_adapters.schema import retry_policy_schema

SPEC_DEFAULT = {
    "max_attempts": 3,
    "initial_interval": "PT1S",
    "backoff_coefficient": 2.0,
    "max_interval": "PT5M",
    "jitter": True,
    "non_retryable_errors": [],
    "on_exhaustion": "discard",
}


def test_ret09_default_policy_is_the_spec_default() -> None:
    assert {k: v for k, v in RetryPolicy().to_dict().items() if k != "backoff_strategy"} == (
        SPEC_DEFAULT
    )
    assert RetryPolicy().backoff_strategy == "exponential"
    assert RetryPolicy.from_dict({}) == RetryPolicy()
    assert RetryPolicy.from_dict(None) == RetryPolicy()


def test_ret10_partial_policy_merges_with_defaults_section_8_1_example() -> None:
    policy = RetryPolicy.from_dict({"max_attempts": 10, "on_exhaustion": "dead_letter"})
    expected = dict(SPEC_DEFAULT, max_attempts=10, on_exhaustion="dead_letter")
    assert {k: v for k, v in policy.to_dict().items() if k != "backoff_strategy"} == expected


def test_ret10_section_12_1_no_retry_effective_policy() -> None:
    policy = RetryPolicy.from_dict({"max_attempts": 1})
    assert policy.to_dict() == dict(DEFAULT_POLICY, max_attempts=1)
    assert policy.schedule() == []


def test_merge_over_a_base_policy() -> None:
    base = RetryPolicy.from_dict({"max_attempts": 7, "initial_interval": "PT2S"})
    policy = RetryPolicy.from_dict({"jitter": False}, base=base)
    assert (policy.max_attempts, policy.initial_interval, policy.jitter) == (
        7, timedelta(seconds=2), False)


def test_policy_is_immutable_and_hashable() -> None:
    policy = RetryPolicy.from_dict({"non_retryable_errors": ["a.b", "c.*"]})
    with pytest.raises(AttributeError):
        policy.max_attempts = 5  # type: ignore[misc]
    assert hash(policy) == hash(RetryPolicy.from_dict({"non_retryable_errors": ["a.b", "c.*"]}))
    assert len({policy, RetryPolicy.from_dict({"non_retryable_errors": ["a.b", "c.*"]})}) == 1


def test_ret16_validating_the_same_policy_twice_returns_the_cached_value() -> None:
    data = {"max_attempts": 4, "non_retryable_errors": ["x.y"]}
    first = RetryPolicy.from_dict(data)
    assert RetryPolicy.from_dict(dict(data)) is first
    assert RetryPolicy.from_dict(first) is first


def test_cache_tells_true_from_one() -> None:
    assert RetryPolicy.from_dict({"max_attempts": 1}).max_attempts == 1
    with pytest.raises(OjsValidationError):
        RetryPolicy.from_dict({"max_attempts": True})


def test_from_json_and_to_dict_round_trip() -> None:
    text = json.dumps({"max_attempts": 25, "initial_interval": "PT15S",
                       "backoff_coefficient": 4.0, "max_interval": "PT1H",
                       "backoff_strategy": "polynomial", "on_exhaustion": "dead_letter"})
    policy = RetryPolicy.from_json(text)
    assert RetryPolicy.from_dict(policy.to_dict()) == policy
    with pytest.raises(OjsValidationError) as info:
        RetryPolicy.from_json("{not json")
    assert info.value.code == "INVALID_RETRY_POLICY"


# Section 11.1: every rule, with a bad value, names the field.
BAD_POLICIES: list[tuple[dict[str, Any], str]] = [
    ({"max_attempts": -1}, "max_attempts"),
    ({"max_attempts": 1.5}, "max_attempts"),
    ({"max_attempts": "3"}, "max_attempts"),
    ({"max_attempts": True}, "max_attempts"),
    ({"max_attempts": None}, "max_attempts"),
    ({"initial_interval": "1S"}, "initial_interval"),
    ({"initial_interval": 1}, "initial_interval"),
    ({"initial_interval": "PT0S"}, "initial_interval"),
    ({"backoff_coefficient": 0.99}, "backoff_coefficient"),
    ({"backoff_coefficient": "2"}, "backoff_coefficient"),
    ({"backoff_coefficient": True}, "backoff_coefficient"),
    ({"backoff_coefficient": float("nan")}, "backoff_coefficient"),
    ({"backoff_coefficient": float("inf")}, "backoff_coefficient"),
    ({"max_interval": "five minutes"}, "max_interval"),
    ({"max_interval": "PT0.5S"}, "max_interval"),
    ({"initial_interval": "PT10M", "max_interval": "PT5M"}, "max_interval"),
    ({"jitter": "yes"}, "jitter"),
    ({"jitter": 1}, "jitter"),
    ({"non_retryable_errors": "auth.*"}, "non_retryable_errors"),
    ({"non_retryable_errors": [1]}, "non_retryable_errors[0]"),
    ({"non_retryable_errors": ["ok", ""]}, "non_retryable_errors[1]"),
    ({"on_exhaustion": "retry"}, "on_exhaustion"),
    ({"on_exhaustion": "DEAD_LETTER"}, "on_exhaustion"),
    ({"backoff_strategy": "fibonacci"}, "backoff_strategy"),
    ({"retries": 3}, "retries"),
]


@pytest.mark.parametrize(("data", "field"), BAD_POLICIES)
def test_ret16_ret20_invalid_policy_names_field_value_and_rule(
    data: dict[str, Any], field: str
) -> None:
    with pytest.raises(OjsValidationError) as info:
        RetryPolicy.from_dict(data)
    err = info.value
    assert err.code == "INVALID_RETRY_POLICY"
    assert err.retryable is False
    assert err.details["field"] == field
    assert err.details["rule"]
    assert "value" in err.details
    assert field.split("[")[0] in str(err)


def test_non_mapping_policy_is_rejected() -> None:
    for bad in ([1, 2], "PT1S", 3):
        with pytest.raises(OjsValidationError) as info:
            RetryPolicy.from_dict(bad)  # type: ignore[arg-type]
        assert info.value.details["field"] == "<policy>"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("PT0.5S", 0.5), ("PT1S", 1), ("PT5M", 300), ("PT1H30M", 5400), ("P1D", 86400),
     ("PT1.5M", 90), ("PT24H", 86400), ("P1DT2H", 93600), ("PT0,5S", 0.5), ("P1W", 604800),
     ("PT1H0.5M", 3630)],
)
def test_ret02_iso8601_durations_parse(text: str, seconds: float) -> None:
    assert parse_duration(text, field="initial_interval").total_seconds() == seconds


@pytest.mark.parametrize(
    "text",
    ["P", "PT", "1S", "PT-1S", "-PT1S", "PTS", "P1Y", "P1M", "P1Y2D", "PT1.5M2S", "PT1H1.5M3S",
     " PT1S", "PT1S ", "pt1s", "PT1e3S", "P1WT1H", "", "T1S"],
)
def test_ret19_invalid_durations_are_rejected(text: str) -> None:
    with pytest.raises(OjsValidationError) as info:
        RetryPolicy.from_dict({"max_interval": text})
    assert info.value.details["field"] == "max_interval"
    assert info.value.details["value"] == text


@pytest.mark.parametrize("value", [5, 1.0, None, ["PT1S"], {"s": 1}, True])
def test_ret19_non_string_durations_are_rejected(value: Any) -> None:
    with pytest.raises(OjsValidationError) as info:
        RetryPolicy.from_dict({"initial_interval": value})
    assert info.value.details["field"] == "initial_interval"


def test_schema_is_the_spec_schema_plus_backoff_strategy_and_opt_in_extensions() -> None:
    schema = retry_policy_schema()
    assert schema["additionalProperties"] is False
    assert set(schema["properties"]) == set(SPEC_DEFAULT) | {
        "backoff_strategy", "jitter_mode", "max_duration"}
    for name, default in SPEC_DEFAULT.items():
        assert schema["properties"][name]["default"] == default


@given(st.integers(min_value=0, max_value=10**6), st.integers(min_value=1, max_value=10**7))
def test_format_duration_round_trips(days: int, micros: int) -> None:
    value = timedelta(days=days % 1000, microseconds=micros)
    assert parse_duration(format_duration(value), field="x") == value


policy_dicts = st.fixed_dictionaries(
    {},
    optional={
        "max_attempts": st.integers(min_value=0, max_value=100),
        "initial_interval": st.sampled_from(["PT0.1S", "PT1S", "PT5S"]),
        "max_interval": st.sampled_from(["PT10S", "PT5M", "PT1H"]),
        "backoff_coefficient": st.floats(min_value=1.0, max_value=10.0),
        "jitter": st.booleans(),
        "non_retryable_errors": st.lists(st.sampled_from(["a.b", "auth.*", "ValueError"])),
        "on_exhaustion": st.sampled_from(["discard", "dead_letter"]),
        "backoff_strategy": st.sampled_from(["none", "linear", "exponential", "polynomial"]),
    },
)


@given(policy_dicts)
def test_ret10_merge_is_idempotent(data: dict[str, Any]) -> None:
    once = RetryPolicy.from_dict(data)
    assert RetryPolicy.from_dict(once.to_dict()) == once
    assert RetryPolicy.from_dict(data, base=once) == once
    for key, value in data.items():
        if key not in ("initial_interval", "max_interval", "non_retryable_errors"):
            assert once.to_dict()[key] == value
