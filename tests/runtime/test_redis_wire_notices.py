"""Maintenance notices (RESP3 pushes) reach redis-py on the connections ``redis_wire`` keeps:
a proxy in front of the real Redis writes them into the stream, as Redis Enterprise does."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

import pytest

from ojs_adapters.runtime import redis_wire
from ojs_adapters.runtime.group_commit import group_of

MIGRATING = b">3\r\n$9\r\nMIGRATING\r\n:1\r\n:30\r\n"


def _moving(endpoint: bytes) -> bytes:
    return b">4\r\n$6\r\nMOVING\r\n:2\r\n:30\r\n$%d\r\n%s\r\n" % (len(endpoint), endpoint)


class _Proxy:
    """Forwards TCP to Redis; ``inject`` writes bytes to every client as if Redis sent them."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.clients: list[socket.socket] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            self.clients.append(client)
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()

    def inject(self, frame: bytes) -> None:
        for client in self.clients:
            client.sendall(frame)
        time.sleep(0.1)  # on the client's socket before its next call

    def close(self) -> None:
        self.listener.close()
        for client in self.clients:
            client.close()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:  # one side gone: close the other, so Redis drops its end too
        sink.close()


@pytest.fixture
def proxied(redis_url: str) -> Iterator[tuple[Any, _Proxy]]:
    import redis

    url = urlparse(redis_url)
    proxy = _Proxy((url.hostname or "127.0.0.1", url.port or 6379))
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
        proxied: tuple[Any, _Proxy], path: str) -> None:
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
        assert call("GET", key) == b"1"
        # read by redis-py's parser with the reply: the timeout relaxed, the socket kept
        assert kept.maintenance_state.name == "MAINTENANCE"
        assert kept._sock is socket_before
        proxy.inject(_moving(b"127.0.0.1:%d" % proxy.port))
        assert call("GET", key) == b"1"
        # the pool learnt the new endpoint; the connection the notice marked is not kept
        assert pool.connection_kwargs["host"] == "127.0.0.1"
        held = pool._ojs_wire_kept[2] if path == "send" else [line._conn]
        assert all(c is None or not c.should_reconnect() for c in held)
        assert call("GET", key) == b"1"
    finally:
        client.delete(key)
