"""The parking threshold both adapters read (RET-11): a number of seconds > 0 (at least 1),
or ``None`` for off; anything else an ``OjsValidationError`` naming the field and rule."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ojs_adapters import OjsValidationError
from ojs_adapters.runtime.parking import MIN_PARK_AFTER, RULE, park_threshold


@given(st.floats(min_value=0, exclude_min=True, allow_infinity=False) | st.integers(1))
def test_a_positive_threshold_is_kept_and_never_under_a_second(value: float) -> None:
    assert park_threshold(value) == max(MIN_PARK_AFTER, float(value))


@pytest.mark.parametrize("off", [None, False])
def test_none_or_false_turns_parking_off(off: object) -> None:
    assert park_threshold(off) is None


@given(st.one_of(st.floats(max_value=0), st.just(math.nan), st.just(math.inf),
                 st.integers(max_value=0), st.text(), st.just(True), st.lists(st.integers())))
def test_anything_else_is_refused_with_the_field_and_the_rule(value: object) -> None:
    with pytest.raises(OjsValidationError) as refused:
        park_threshold(value, field="ojs_park_after")
    assert refused.value.code == "INVALID_ARGS"
    assert (refused.value.details["field"], refused.value.details["rule"]) == (
        "ojs_park_after", RULE)
