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
from hypothesis import HealthCheck, given, settings
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


def test_an_unreadable_record_is_never_written_over_by_a_later_attempt() -> None:
    """As the script reads it: no attempt in the stored text, so no earlier one."""
    store = MemoryRecordStore()
    store._records["m1"] = ("not json", float("inf"))
    started = JobRecord("m1", "t", "q", 3).started(2).to_dict()
    reply = store.begin("m1:2", "sent|d1", 60_000, "m1", started, attempt=2)
    assert (reply.claim, reply.record, reply.wrote) == ("new", "not json", False)
