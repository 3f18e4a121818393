"""``MemoryRecordStore.begin`` admits a delivery as ``RedisRecordStore.begin``'s script does.

A property test runs the same sequence of admissions (tokens of two copies, attempts,
with and without a lease, with and without an ``active`` record to write) against both
stores, the Redis one on the real server, and compares every reply and the record left.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dramatiq_ext.stores import MemoryRecordStore, RedisRecordStore
from ojs_adapters import JobRecord

_TOKENS = ("sent|d1", "sent|d2", "copy|d3")
_NOW = datetime(2026, 11, 27, tzinfo=timezone.utc)  # both stores get the same record text
_CALLS = st.tuples(st.sampled_from(_TOKENS), st.integers(1, 3), st.booleans(),
                   st.booleans(), st.booleans())


def _admit(store: Any, token: str, attempt: int, lease: bool, fresh: bool,
           stated: bool) -> tuple[Any, ...]:
    started = JobRecord("m1", "t", "q", 3).started(attempt, now=_NOW).to_dict() if fresh else None
    reply = store.begin(f"m1:{attempt}", token, 60_000, "m1", started,
                        lease_ms=60_000 if lease else None,
                        attempt=attempt if stated else None)
    record = reply.record.decode() if isinstance(reply.record, bytes) else reply.record
    return (reply.claim, record, reply.wrote, reply.leased)


@pytest.mark.broker
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(calls=st.lists(_CALLS, min_size=1, max_size=6))
@example(calls=[("sent|d1", 2, True, True, True)] * 2)  # a retried call: its own start
@example(calls=[("sent|d1", 1, True, True, False), ("sent|d2", 2, False, True, True),
                ("copy|d3", 2, True, True, True)])
def test_memory_admission_answers_as_the_redis_script(redis_url: str, calls: list[Any]) -> None:
    import redis

    client = redis.Redis.from_url(redis_url)
    prefix = f"ojs-test-begin-{uuid.uuid4().hex[:10]}"
    on_redis = RedisRecordStore(client=client, prefix=prefix)
    in_memory = MemoryRecordStore()
    try:
        for call in calls:
            assert _admit(in_memory, *call) == _admit(on_redis, *call), call
        assert in_memory.load("m1") == on_redis.load("m1")
    finally:
        stale = client.keys(f"{prefix}:*")
        if stale:
            client.delete(*stale)
        client.close()


@pytest.mark.broker
@pytest.mark.parametrize("stored", [
    "not json", "[1]", '{"attempt": true}', '{"attempt": null}', '{"attempt": "x"}',
    '{"attempt": "1"}', '{"attempt": 1.0}', '{"attempt": 3}', '{"id": "m1"}',
    "[" * 5000 + "]" * 5000,
])
def test_a_stored_text_is_read_as_the_script_reads_it(redis_url: str, stored: str) -> None:
    """Written over only when its attempt reads as a number below this one (``tonumber``);
    an unreadable text, or one without an attempt, never."""
    import redis

    client = redis.Redis.from_url(redis_url)
    prefix = f"ojs-test-begin-{uuid.uuid4().hex[:10]}"
    on_redis = RedisRecordStore(client=client, prefix=prefix)
    in_memory = MemoryRecordStore()
    client.set(f"{prefix}:m1", stored)
    in_memory._records["m1"] = (stored, float("inf"))
    try:
        replies = [_admit(store, "sent|d1", 2, False, True, True)
                   for store in (in_memory, on_redis)]
    finally:
        client.delete(f"{prefix}:m1", f"{prefix}:claim:m1:2")
        client.close()
    assert replies[0] == replies[1]
    assert replies[0][2] == (stored in ('{"attempt": "1"}', '{"attempt": 1.0}'))
