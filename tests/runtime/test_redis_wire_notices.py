"""Maintenance notices (RESP3 pushes) reach redis-py on the connections ``redis_wire`` keeps:
the tests' proxy in front of the real Redis writes them into the stream, as Redis Enterprise
does."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

import pytest

from ojs_adapters.runtime import redis_wire
from ojs_adapters.runtime.group_commit import group_of
from tests.handoff.proxy import Proxy

MIGRATING = b">3\r\n$9\r\nMIGRATING\r\n:1\r\n:30\r\n"


def _moving(endpoint: bytes) -> bytes:
    return b">4\r\n$6\r\nMOVING\r\n:2\r\n:30\r\n$%d\r\n%s\r\n" % (len(endpoint), endpoint)


@pytest.fixture
def proxied(redis_url: str) -> Iterator[tuple[Any, Proxy]]:
    import redis

    url = urlparse(redis_url)
    proxy = Proxy(url.hostname or "127.0.0.1", url.port or 6379)
    client = redis.Redis(host="localhost", port=proxy.port)  # RESP3 in redis-py 8
    enabled = getattr(client.connection_pool, "maint_notifications_enabled", None)
    if enabled is None or not enabled():
        client.close()
        proxy.close()
        pytest.skip("this redis-py reads no maintenance notices (6.3+, RESP3)")
    try:
        yield client, proxy
    finally:
        client.close()
        proxy.close()


@pytest.mark.parametrize("path", ["send", "group commit"])
def test_notices_on_a_kept_connection_are_read_not_dropped(
        proxied: tuple[Any, Proxy], path: str) -> None:
    client, proxy = proxied
    pool = redis_wire.pool_of(client)
    key = f"ojs-test:notice:{uuid.uuid4().hex}"
    line = group_of(client)._line

    def call(*command: Any) -> Any:
        if path == "send":
            return redis_wire.send(pool, [command])[0]
        return line.send(pool, [command])[0]

    try:
        assert call("SET", key, "1") == b"OK"
        kept = pool._ojs_wire_kept[2][0] if path == "send" else line._conn
        socket_before = kept._sock
        proxy.inject(MIGRATING)
        time.sleep(0.1)  # on the client's socket before its next call
        assert call("GET", key) == b"1"
        # read by redis-py's parser with the reply: the timeout relaxed, the socket kept
        assert kept.maintenance_state.name == "MAINTENANCE"
        assert kept._sock is socket_before
        proxy.inject(_moving(b"127.0.0.1:%d" % proxy.port))
        time.sleep(0.1)
        assert call("GET", key) == b"1"
        # the pool learnt the new endpoint; the connection the notice marked is not kept
        assert pool.connection_kwargs["host"] == "127.0.0.1"
        held = pool._ojs_wire_kept[2] if path == "send" else [line._conn]
        assert all(c is None or not c.should_reconnect() for c in held)
        assert call("GET", key) == b"1"
    finally:
        client.delete(key)
