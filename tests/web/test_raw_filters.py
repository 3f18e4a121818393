"""Filters over 10,000 dead letters read one field of each raw message, not the whole (issue 19).

``raw_string`` and ``raw_error_type`` must say what decoding would say, or ``None``
(then the consoles decode): never a wrong value. Checked on messages built the way
the adapters build them, and on ones made to mislead a byte search.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import pytest

from celery_ext import _console as celery_console
from dramatiq_ext import _raw_filter as dramatiq_filter
from ojs_adapters.history import ErrorEntry, JobRecord
from ojs_adapters.runtime.dlq import DeadLetterFilter
from ojs_adapters.runtime.handoff import error_headers
from ojs_adapters.runtime.raw_fields import raw_error_type, raw_string

STAMP = "2026-11-24T10:00:00.000Z"
FILTERS = [DeadLetterFilter(task_type="billing.charge"), DeadLetterFilter(task_type="billing.*"),
           DeadLetterFilter(error_type="card.Declined"), DeadLetterFilter(error_type="net.*"),
           DeadLetterFilter(ids=frozenset({"job-1"})),
           DeadLetterFilter(since=datetime(2026, 11, 24, 10, tzinfo=timezone.utc)),
           DeadLetterFilter(until=datetime(2026, 11, 24, 10, 0, 0, 1000, tzinfo=timezone.utc)),
           DeadLetterFilter(task_type="billing.*", error_type="card.*")]


def _entry(kind: str, details: dict[str, Any] | None = None) -> ErrorEntry:
    return ErrorEntry(1, "HANDLER_ERROR", kind, 'said "no" \\ <b>', STAMP, details=details)


def celery_envelope(*, task: str = "billing.charge", kind: str = "card.Declined",
                    x_ojs: bool = True, details: dict[str, Any] | None = None,
                    extra: dict[str, Any] | None = None) -> bytes:
    """A dead letter as kombu's Redis transport keeps it (``celery_ext._deadletter``)."""
    entry = _entry(kind, details)
    record = JobRecord("job-1", task, "q", 3, state="discarded", attempt=1, errors=(entry,),
                       dead_lettered=True, outcome="dead_letter", updated_at=STAMP)
    headers: dict[str, Any] = {"lang": "py", "task": task, "id": "job-1",
                               "ojs": json.dumps({"attempt": 1, "errors": [entry.to_dict()]}),
                               "ojs-dead-letter": record.to_json(), **(extra or {})}
    if x_ojs:
        headers.update(error_headers(entry, 1))
    return json.dumps({"body": "W10=", "content-type": "application/json", "headers": headers,
                       "properties": {"correlation_id": "job-1"}}).encode()


def dramatiq_message(*, actor: str = "billing.charge", kind: str = "card.Declined",
                     x_ojs: bool = True, details: dict[str, Any] | None = None,
                     args: list[Any] | None = None) -> bytes:
    """A dead Dramatiq message as its JSON encoder writes it (``.XQ.msgs``)."""
    entry = _entry(kind, details)
    options: dict[str, Any] = {"ojs": {"attempt": 1, "errors": [entry.to_dict()],
                                       "dead_letter": True}}
    if x_ojs:
        options.update(error_headers(entry, 1))
    return json.dumps({"queue_name": "q", "actor_name": actor, "args": args or [],
                       "kwargs": {}, "options": options, "message_id": "job-1",
                       "message_timestamp": 1}, separators=(",", ":")).encode()


MISLEADING: dict[str, dict[str, Any]] = {
    "plain": {},
    "no x-ojs headers": {"x_ojs": False},
    "type in the error details": {"details": {"type": "net.Down", "updated_at": "1999"}},
    "a non-ascii error type": {"kind": "card.Déclined"},
    "an error type with a quote": {"kind": 'card."Declined'},
    "a net error": {"kind": "net.Down"},
}


@pytest.mark.parametrize("case", list(MISLEADING), ids=list(MISLEADING))
def test_celery_raw_filter_agrees_with_decoding(case: str) -> None:
    variants = [celery_envelope(**MISLEADING[case]),
                celery_envelope(**MISLEADING[case], extra={"meta": {"task": "x", "id": "y"}}),
                celery_envelope(**MISLEADING[case], extra={'x"task': "other.task"}),
                celery_envelope(**MISLEADING[case], task="other.task")]
    for raw in variants:
        for filters in FILTERS:
            expected = celery_console._may_match(json.loads(raw), filters)
            assert celery_console._passes(raw, filters) == expected, (raw, filters)


@pytest.mark.parametrize("case", list(MISLEADING), ids=list(MISLEADING))
def test_dramatiq_raw_filter_agrees_with_decoding(case: str) -> None:
    nested = {"actor_name": "x", "message_id": "y", "type": "z"}
    variants = [dramatiq_message(**MISLEADING[case]),
                dramatiq_message(**MISLEADING[case], args=[nested, '"actor_name":"x"']),
                dramatiq_message(**MISLEADING[case], actor="other.task")]
    for raw in variants:
        for filters in FILTERS:
            if filters.since or filters.until:
                continue  # a score range on Redis, never read from the message
            expected = dramatiq_filter.may_match(raw, filters)
            assert dramatiq_filter.passes(raw, filters) == expected, (raw, filters)


def test_raw_reads_say_none_rather_than_guess() -> None:
    assert raw_string(b'{"a": {"task": "x"}, "task": "y"}', b"task") is None  # twice
    assert raw_string(b'{"task": "a\\"b"}', b"task") is None  # an escape in the value
    assert raw_string(b'{"task": 1}', b"task") is None  # not a string
    assert raw_string(b'{"x\\"task": "evil"}', b"task") is None  # inside another key
    assert raw_string(celery_envelope(), b"updated_at", escaped=True) == STAMP
    assert raw_error_type(celery_envelope(kind="net.Down")) == "net.Down"
    assert raw_error_type(dramatiq_message(kind="net.Down")) == "net.Down"
    assert raw_error_type(celery_envelope(x_ojs=False)) is None
