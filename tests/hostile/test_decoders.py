"""Fuzzing the decoders of the OJS state a message carries (issue 8, "Bad input").

``celery_ext._headers.HeaderState.from_headers`` (the ``ojs`` header) and
``dramatiq_ext._state.MessageState.of`` (``options["ojs"]``) read wire data: for
any JSON they must return a state whose fields are within bounds, or mark it
``invalid`` (then the worker dead-letters it with an ``INVALID_PAYLOAD`` entry).
Pure unit tests: no broker.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celery_ext._headers import HEADER, HeaderState
from dramatiq_ext._options import InvalidRetryPolicy, policy_option
from dramatiq_ext._state import STATE_OPTION, MessageState
from ojs_adapters import OjsValidationError, RetryPolicy, decide
from ojs_adapters.history import (
    MAX_ATTEMPT,
    MAX_DECODED_ENTRIES,
    MAX_MESSAGE_CHARS,
    MAX_NAME_CHARS,
    MIN_HISTORY,
    ErrorEntry,
)

_SCALARS = (st.none() | st.booleans() | st.integers() | st.floats()
            | st.text(max_size=30) | st.sampled_from([2**31, 2**63, -1, 0, 1e308, "1"]))
#: Any JSON value (and some Python-only ones, like NaN), nested a few levels.
JSON = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=10), inner, max_size=4), max_leaves=20)
_ENTRY = st.fixed_dictionaries(
    {}, optional={"attempt": JSON | st.integers(1, 5), "code": JSON | st.text(max_size=5),
                  "type": JSON, "message": JSON, "occurred_at": JSON, "timestamp": JSON,
                  "handler_code": JSON, "details": JSON})
#: An ``ojs`` state object: the known keys with plausible or hostile values.
STATE = st.fixed_dictionaries({}, optional={
    "attempt": JSON | st.integers(-3, 2**40),
    "errors": JSON | st.lists(_ENTRY | JSON, max_size=6),
    "countdowns": JSON | st.lists(st.floats(), max_size=4),
    "jitter_samples": JSON | st.lists(st.none() | st.floats(0, 1), max_size=4),
    "policy": JSON | st.fixed_dictionaries({}, optional={"max_attempts": JSON,
                                                         "jitter": JSON}),
    "not_before": JSON, "first_attempt_at": JSON, "dead_letter": JSON,
    "replay_count": JSON, "last_replayed_at": JSON,
}) | JSON
FUZZ = settings(max_examples=200, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


def _check_entries(errors: tuple[ErrorEntry, ...], limit: int) -> None:
    assert len(errors) <= limit
    for entry in errors:
        assert type(entry.attempt) is int
        assert len(entry.message) <= MAX_MESSAGE_CHARS + 40
        for text in (entry.code, entry.type, entry.occurred_at, entry.handler_code or ""):
            assert isinstance(text, str) and len(text) <= MAX_NAME_CHARS + 40
        json.dumps(entry.to_dict())


def _check_invalid(state: Any) -> None:
    """An invalid state still gives ``decide`` what it needs: a dead letter, INVALID_PAYLOAD."""
    if state.invalid is None:
        return
    decision = decide(RetryPolicy(), state.attempt, state.invalid)
    assert (decision.action, decision.entry.code) == ("dead_letter", "INVALID_PAYLOAD")
    assert len(json.dumps(decision.entry.to_dict())) < 4096


@FUZZ
@given(STATE, st.booleans())
def test_celery_header_decoder_never_raises_and_bounds_every_field(data: Any,
                                                                   as_text: bool) -> None:
    raw = json.dumps(data) if as_text else data
    state = HeaderState.from_headers({HEADER: raw})
    assert type(state.attempt) is int and 1 <= state.attempt <= MAX_ATTEMPT
    _check_entries(state.errors, MIN_HISTORY)
    assert len(state.countdowns) <= MAX_DECODED_ENTRIES
    assert all(isinstance(c, float) and c >= 0 for c in state.countdowns)
    assert all(s is None or 0 <= s < 1 for s in state.jitter_samples)
    assert state.policy is None or isinstance(state.policy, dict)
    for moment in (state.not_before, state.first_attempt_at):
        assert moment is None or isinstance(moment, float)
    json.loads(state.encode())  # what a retry writes back is JSON again
    _check_invalid(state)


@FUZZ
@given(STATE)
def test_dramatiq_options_decoder_never_raises_and_bounds_every_field(data: Any) -> None:
    state = MessageState.of({STATE_OPTION: data})
    assert type(state.attempt) is int and 1 <= state.attempt <= MAX_ATTEMPT
    _check_entries(state.errors, MAX_DECODED_ENTRIES)
    assert isinstance(state.dead_letter, bool) and type(state.replay_count) is int
    assert state.last_replayed_at is None or len(state.last_replayed_at) <= 64 + 40
    json.dumps(state.to_option())
    _check_invalid(state)


@FUZZ
@given(JSON)
def test_a_smuggled_policy_is_refused_only_with_the_validation_error(data: Any) -> None:
    """The Dramatiq middleware ignores a message policy that raises ``InvalidRetryPolicy``,
    and ``_attempt`` a header policy that raises ``OjsValidationError``: nothing else escapes."""
    with contextlib.suppress(OjsValidationError):
        RetryPolicy.from_dict(data)
    with contextlib.suppress(InvalidRetryPolicy):
        policy_option(data, base=RetryPolicy(), where="fuzz")


@pytest.mark.parametrize("raw", [
    "{not json", b"\xff\xfe", "[1, 2]", '"text"', "1" * 5000, "[" * 100_000,
    json.dumps({"attempt": int("9" * 4000)}), json.dumps({"attempt": 2**31}),
    json.dumps({"attempt": 2.0}), json.dumps({"attempt": True}), json.dumps({"attempt": None}),
    json.dumps({"attempt": -7}), json.dumps({"attempt": "3"}),
], ids=lambda raw: repr(raw)[:24])
def test_an_unreadable_header_or_attempt_is_an_invalid_payload(raw: Any) -> None:
    state = HeaderState.from_headers({HEADER: raw})
    assert state.invalid is not None and state.attempt == 1
    assert state.invalid.catalog_code == "INVALID_PAYLOAD"
    assert len(state.invalid.details["value"]) < 300  # type: ignore[index]


def test_huge_history_and_message_are_bounded_cheaply() -> None:
    """100,000 entries and a 10 MB message: the newest entries kept, the message cut."""
    big = "x" * 10_000_000
    errors = [{"attempt": i, "code": "HANDLER_ERROR", "message": "m"} for i in range(100_000)]
    errors[-1]["message"] = big
    celery = HeaderState.from_headers({HEADER: json.dumps({"attempt": 3, "errors": errors})})
    dramatiq = MessageState.of({STATE_OPTION: {"attempt": 3, "errors": errors}})
    assert [e.attempt for e in celery.errors] == list(range(99_990, 100_000))
    assert dramatiq.errors[0].attempt == 100_000 - MAX_DECODED_ENTRIES
    for state in (celery, dramatiq):
        assert len(state.errors[-1].message) < MAX_MESSAGE_CHARS + 40
        assert state.invalid is None


def test_bad_bookkeeping_fields_are_dropped_not_fatal() -> None:
    raw = json.dumps({"attempt": 2, "errors": ["junk", {"code": "X"}, {"attempt": "x", "code": 1}],
                      "countdowns": [1.0, "x"], "jitter_samples": [2.0],
                      "not_before": "soon", "first_attempt_at": float("inf"),
                      "policy": "everything", "unknown": 1})
    state = HeaderState.from_headers({HEADER: raw})
    assert state.invalid is None and state.attempt == 2 and state.errors == ()
    assert set(state.ignored) == {"countdowns", "jitter_samples", "not_before",
                                  "first_attempt_at", "policy"}
