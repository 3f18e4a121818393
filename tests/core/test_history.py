"""Error history and the job record (ojs-retry.md section 10; RET-14, RET-15, ERR-011, ERR-012)."""

from __future__ import annotations

import json
from datetime import datetime, timezone

from hypothesis import given
from hypothesis import strategies as st

from ojs_adapters import ErrorEntry, JobError, JobRecord, RetryPolicy, decide
from ojs_adapters.history import (
    MAX_MESSAGE_CHARS,
    MIN_HISTORY,
    append_entry,
    bound_message,
    iso_from_epoch,
    iso_utc,
    safe_details,
)


def entry(attempt: int) -> ErrorEntry:
    return ErrorEntry(attempt, "HANDLER_ERROR", "ValueError", f"fail {attempt}",
                      "2026-02-15T10:30:00.000Z")


def test_ret15_err011_at_least_ten_newest_entries_are_kept() -> None:
    errors: tuple[ErrorEntry, ...] = ()
    for n in range(1, 13):
        errors = append_entry(errors, entry(n))
    assert [e.attempt for e in errors] == list(range(3, 13))
    assert len(append_entry(errors, entry(13), keep=3)) == MIN_HISTORY  # never below 10
    more: tuple[ErrorEntry, ...] = ()
    for n in range(1, 31):
        more = append_entry(more, entry(n), keep=25)
    assert [e.attempt for e in more] == list(range(6, 31))


@given(st.integers(1, 60), st.integers(0, 40))
def test_retention_keeps_the_newest_in_order(count: int, keep: int) -> None:
    errors: tuple[ErrorEntry, ...] = ()
    for n in range(1, count + 1):
        errors = append_entry(errors, entry(n), keep=keep)
    kept = min(count, max(keep, MIN_HISTORY))
    assert [e.attempt for e in errors] == list(range(count - kept + 1, count + 1))


def test_long_messages_are_truncated_with_a_marker() -> None:
    text = "x" * 10_000
    cut = bound_message(text)
    assert cut.startswith("x" * MAX_MESSAGE_CHARS)
    assert cut.endswith(f"[truncated {10_000 - MAX_MESSAGE_CHARS} chars]")
    d = decide(RetryPolicy(), 1, ValueError(text))
    assert len(d.entry.message) < MAX_MESSAGE_CHARS + 40


def test_details_that_are_not_json_become_their_repr() -> None:
    assert safe_details({"a": 1}) == {"a": 1}
    odd = safe_details({"when": datetime(2026, 1, 1)})
    assert odd is not None and set(odd) == {"repr"} and "datetime" in odd["repr"]
    assert safe_details({"big": "y" * 100_000}) is not None
    assert len(json.dumps(safe_details({"big": "y" * 100_000}))) < 2000
    d = decide(RetryPolicy(), 1, JobError("a.b", "m", details={"obj": object()}))
    assert d.entry.details is not None and "repr" in d.entry.details


def test_timestamps_are_iso_utc_with_z() -> None:
    assert iso_utc(datetime(2026, 2, 15, 10, 30, 0, 123456, tzinfo=timezone.utc)) == (
        "2026-02-15T10:30:00.123Z")
    assert iso_from_epoch(1771151400.25) == "2026-02-15T10:30:00.250Z"
    assert iso_from_epoch(1771151400.999) == "2026-02-15T10:30:00.999Z"


def test_ret14_record_tracks_attempt_errors_and_next_retry_at() -> None:
    record = JobRecord(id="j1", type="email.send", queue="emails", max_attempts=3)
    record = record.started(1)
    now = datetime(2026, 2, 15, 10, 30, tzinfo=timezone.utc)
    d = decide(RetryPolicy(), 1, ValueError("smtp"), jitter_sample=0.5, now=now)
    record = record.failed(d.entry, action=d.action, delay=d.delay)
    assert (record.state, record.attempt, record.next_retry_at) == (
        "retryable", 1, "2026-02-15T10:30:01.000Z")
    record = record.started(2)
    assert (record.state, record.next_retry_at) == ("active", None)
    record = record.completed()
    assert (record.state, record.outcome, len(record.errors)) == ("completed", "completed", 1)


def test_dead_lettered_and_discarded_records_both_end_discarded() -> None:
    base = JobRecord(id="j", type="t", queue="q", max_attempts=1).started(1)
    dead = base.failed(entry(1), action="dead_letter")
    gone = base.failed(entry(1), action="discard")
    failed = base.failed(entry(1), action="fail")
    assert (dead.state, dead.dead_lettered, dead.outcome) == ("discarded", True, "dead_letter")
    assert (gone.state, gone.dead_lettered, gone.outcome) == ("discarded", False, "discarded")
    assert failed.outcome == "failed"


def test_record_round_trips_through_plain_json() -> None:
    record = JobRecord(id="j", type="t", queue="q", max_attempts=3,
                       extra={"countdowns": [1.5]}).started(1)
    record = record.failed(decide(RetryPolicy(), 1, JobError("a.b", "m", code="RETRY",
                                                             details={"k": [1]})).entry,
                           action="retry", delay=1.5)
    data = json.loads(record.to_json())
    assert data["errors"][0]["handler_code"] == "RETRY"
    assert data["countdowns"] == [1.5]
    for key in ("id", "type", "queue", "state", "attempt", "max_attempts", "errors",
                "next_retry_at", "dead_lettered", "outcome"):
        assert key in data
    assert JobRecord.from_dict(data) == record


def test_entries_from_untrusted_data_are_bounded() -> None:
    data = {"attempt": "2", "code": "HANDLER_ERROR", "message": "m" * 1_000_000,
            "timestamp": "2026-01-01T00:00:00Z", "details": {"x": object()}}
    e = ErrorEntry.from_dict(data)
    assert e.attempt == 2 and len(e.message) < MAX_MESSAGE_CHARS + 40
    assert e.occurred_at == "2026-01-01T00:00:00Z"
    assert e.details is not None and "repr" in e.details


def test_end_reason_is_kept_when_a_job_ends_and_dropped_when_it_runs_again() -> None:
    from ojs_adapters.history import ErrorEntry, JobRecord

    entry = ErrorEntry(attempt=1, code="HANDLER_ERROR", type="E", message="m",
                       occurred_at="2026-02-15T10:30:00.000Z")
    record = JobRecord(id="j", type="t", queue="q", max_attempts=1).started(1)
    ended = record.failed(entry, action="discard", reason="max_duration")
    assert ended.extra["end_reason"] == "max_duration"
    assert "end_reason" not in record.failed(entry, action="retry", delay=1.0).extra
    again = ended.started(1)
    assert "end_reason" not in again.extra and "end_reason" not in again.completed().extra
