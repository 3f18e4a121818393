"""Hand-crafted hostile ``ojs`` headers on a real Celery worker (memory broker and Redis,
issue 8). Not RabbitMQ: AMQP headers must fit in one frame (128 KiB by default), so the
broker itself refuses the 10 MB header at publish; it never reaches a worker.

Each message ends as ``celery_ext._headers`` documents: an unreadable header or
attempt is dead-lettered unrun with an ``INVALID_PAYLOAD`` entry; a huge history,
a 10 MB message, junk entries, wrong types and an invalid policy are bounded or
ignored and the job runs; and the worker keeps serving plain jobs afterwards.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from celery.contrib.testing.worker import start_worker

from celery_ext import HEADER, get_job_record
from ojs_adapters import JobRecord
from tests.celery_ext.support import (
    RUNS,
    Broker,
    broker_named,
    drain,
    register_tasks,
    wait_for,
)

HUGE_HISTORY = [{"attempt": i, "code": "HANDLER_ERROR", "type": "E", "message": "m"}
                for i in range(1, 100_001)]
HUGE_HISTORY[-1]["message"] = "x" * 10_000_000

#: name -> (header value, script of the task body)
INVALID = {
    "not-json": ("{attempt: 2", ["ok"]),
    "not-an-object": ("[1, 2, 3]", ["ok"]),
    "attempt-text": (json.dumps({"attempt": "two"}), ["ok"]),
    "attempt-negative": (json.dumps({"attempt": -4}), ["ok"]),
    "attempt-huge": (json.dumps({"attempt": 10**30}), ["ok"]),
    "attempt-float": (json.dumps({"attempt": 2.5}), ["ok"]),
}
BOUNDED = {
    "huge-history": (json.dumps({"attempt": 2, "errors": HUGE_HISTORY}), ["ok"]),
    "junk-entries": (json.dumps({"attempt": 1, "errors": [1, "x", None, [], {"code": "X"},
                                 {"attempt": 1, "code": "HANDLER_ERROR", "message": "old"}]}),
                     ["ok"]),
    "wrong-types": (json.dumps({"attempt": 2, "errors": "x", "countdowns": {"a": 1},
                                "jitter_samples": "abc", "not_before": "later",
                                "first_attempt_at": [], "policy": 5}), ["ok"]),
    "invalid-policy": (json.dumps({"attempt": 1, "policy": {"max_attempts": -1,
                                                            "backoff_strategy": "boom"}}),
                       ["raise:value"]),
}


@pytest.fixture(params=["memory", "redis"])
def worker(request: pytest.FixtureRequest) -> Iterator[tuple[Any, Any, str]]:
    broker: Broker = broker_named(request.param)
    app = broker.make_app("ojs-hostile")
    task = register_tasks(app)["scripted"]
    queue = broker.queue_name("hostile")
    try:
        with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False,
                          queues=[queue], loglevel="ERROR", shutdown_timeout=10):
            yield app, task, queue
    finally:
        broker.cleanup(app)


def _record(app: Any, task_id: str) -> JobRecord:
    record: JobRecord = wait_for(lambda: _ended(get_job_record(task_id, app=app)), timeout=30)
    return record


def _ended(record: JobRecord | None) -> JobRecord | None:
    return record if record is not None and record.outcome is not None else None


def test_hostile_headers_end_as_documented_and_the_worker_moves_on(
        worker: tuple[Any, Any, str]) -> None:
    app, task, queue = worker
    sent = {name: task.apply_async((script,), queue=queue, headers={HEADER: header}).id
            for name, (header, script) in {**INVALID, **BOUNDED}.items()}
    plain = task.apply_async((["ok"],), queue=queue).id

    for name in INVALID:  # dead-lettered before the body ran, the original headers kept
        record = _record(app, sent[name])
        assert (record.outcome, record.dead_lettered) == ("dead_letter", True), name
        assert record.errors[-1].code == "INVALID_PAYLOAD", name
        assert RUNS[sent[name]] == [], name
    letters = drain(app, f"{queue}.dead_letter", expect=len(INVALID), timeout=10)
    assert sorted(m.headers["id"] for m in letters) == sorted(sent[n] for n in INVALID)
    assert {m.headers["x-ojs-error-code"] for m in letters} == {"INVALID_PAYLOAD"}
    by_id = {m.headers["id"]: m for m in letters}
    assert by_id[sent["not-json"]].headers[HEADER] == INVALID["not-json"][0]

    huge = _record(app, sent["huge-history"])  # bounded: the 10 newest, message cut
    assert (huge.outcome, huge.attempt) == ("completed", 2)
    assert [e.attempt for e in huge.errors] == list(range(99_991, 100_001))
    assert len(huge.errors[-1].message) < 2100
    junk = _record(app, sent["junk-entries"])
    assert junk.outcome == "completed" and [e.message for e in junk.errors] == ["old"]
    assert _record(app, sent["wrong-types"]).outcome == "completed"
    assert [r.attempt for r in RUNS[sent["wrong-types"]]] == [2]
    policy = _record(app, sent["invalid-policy"])  # the task's own policy: 3 attempts
    assert (policy.outcome, policy.attempt, policy.max_attempts) == ("discarded", 3, 3)
    assert _record(app, plain).outcome == "completed"
