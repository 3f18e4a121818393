"""``celery_ext._heartbeat`` against a real Redis channel, driven tick by tick (no worker).

Two deliveries age past a 1 s visibility timeout; kombu's own restore sweep then
hands out again only the one the heartbeat did not hold (RET-13). An acked
delivery leaves the heartbeat and is not written back into the unacked index.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from kombu import Connection

from celery_ext._heartbeat import Heartbeat, heartbeat_interval
from tests.brokers import REDIS_URL

pytestmark = pytest.mark.broker
VISIBILITY = 1.0


@pytest.fixture
def channel_queue(redis_url: str) -> Iterator[tuple[Any, str]]:
    """A kombu SimpleQueue on Redis with a 1 s visibility timeout, and its key prefix."""
    prefix = f"ojs-test-{uuid.uuid4().hex[:8]}:"
    conn = Connection(redis_url, transport_options={"global_keyprefix": prefix,
                                                    "visibility_timeout": VISIBILITY})
    simple = conn.SimpleQueue(f"{prefix}hb", no_ack=False)
    try:
        yield simple, prefix
    finally:
        simple.close()
        conn.close()
        client = redis.Redis.from_url(REDIS_URL)
        for key in client.scan_iter(match=f"{prefix}*", count=500):
            client.delete(key)


def test_ret13_held_delivery_is_not_restored_and_acked_one_is_not_re_added(
        channel_queue: tuple[Any, str]) -> None:
    simple, prefix = channel_queue
    simple.put("held")
    simple.put("plain")
    held, plain = simple.get(timeout=5), simple.get(timeout=5)
    assert (held.payload, plain.payload) == ("held", "plain")
    beat = Heartbeat()
    assert beat.hold(held, start=False) and beat.held() == 1
    time.sleep(VISIBILITY + 0.2)  # both scores are now older than the timeout
    assert beat.tick() is not None  # refreshes "held" (its first refresh was due at 0.25 s)
    channel = held.channel
    index = f"{prefix}{channel.unacked_index_key}"  # the key as kombu prefixes it
    client = redis.Redis.from_url(REDIS_URL)
    assert time.time() - float(client.zscore(index, held.delivery_tag) or 0) < 0.5
    channel.qos.restore_visible(num=10, interval=1)  # kombu's sweep, as any worker runs it
    again = simple.get(timeout=5)
    assert again.payload == "plain"  # handed out again: nothing held it
    with pytest.raises(simple.Empty):
        simple.get(timeout=0.3)  # "held" stayed reserved
    again.ack()
    held.ack()
    assert beat.tick() is None and beat.held() == 0  # forgotten once acked
    assert client.zscore(index, held.delivery_tag) is None  # and never written back


def test_only_redis_deliveries_are_held_and_a_closed_channel_ends_the_hold(
        channel_queue: tuple[Any, str]) -> None:
    with Connection("memory://") as conn:
        memory = conn.SimpleQueue(f"hb-{uuid.uuid4().hex[:6]}", no_ack=False)
        memory.put("x")
        assert not Heartbeat().hold(memory.get(timeout=1), start=False)
        memory.close()
    simple, _prefix = channel_queue
    simple.put("y")
    message = simple.get(timeout=5)
    beat = Heartbeat()
    assert beat.hold(message, start=False)
    message.channel.closed = True  # what Channel.close() sets when the connection goes
    try:
        assert beat.tick() is None and beat.held() == 0
    finally:
        message.channel.closed = False


def test_refresh_interval_is_a_quarter_of_the_timeout_within_bounds() -> None:
    assert heartbeat_interval(2) == 0.5
    assert heartbeat_interval(0.01) == 0.05
    assert heartbeat_interval(3600) == 60.0
