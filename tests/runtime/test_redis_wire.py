"""``redis_wire`` on a real Redis: replies in order, error replies in place, a dropped
connection retried as the client says, and clients it must leave alone."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ojs_adapters.runtime import redis_wire
from ojs_adapters.runtime.group_commit import run_script, script_sha


def _kill(redis_url: str, name: str) -> None:
    """Close, on the server's side, the connection named ``name`` (CLIENT SETNAME)."""
    import redis

    admin = redis.Redis.from_url(redis_url)
    try:
        assert admin.client_kill_filter(_id=next(
            c["id"] for c in admin.client_list() if c.get("name") == name)) == 1
    finally:
        admin.close()


def test_replies_come_back_in_order_with_an_error_reply_in_its_place(
        client: Any, key: str) -> None:
    pool = redis_wire.pool_of(client)
    assert pool is client.connection_pool
    replies = redis_wire.send(pool, [("RPUSH", key, "a"), ("EVAL", "return redis.error_reply("
                                      "'boom')", 0), ("RPUSH", key, "b"), ("LRANGE", key, 0, -1)])
    assert replies[0] == 1 and replies[2] == 2 and replies[3] == [b"a", b"b"]
    assert redis_wire.is_reply_error(replies[1]) and "boom" in str(replies[1])
    assert redis_wire.send(pool, [("LLEN", key)]) == [2]  # the connection is still in step


def test_a_decoding_client_gets_text(redis_url: str, key: str) -> None:
    import redis

    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        pool = redis_wire.pool_of(client)
        assert redis_wire.send(pool, [("SET", key, "v"), ("GET", key)]) == ["OK", "v"]
    finally:
        client.delete(key)
        client.close()


def test_a_killed_connection_is_retried_on_a_new_one(
        client: Any, key: str, redis_url: str) -> None:
    pool = redis_wire.pool_of(client)
    name = f"ojs-wire-{uuid.uuid4().hex[:8]}"
    assert redis_wire.send(pool, [("CLIENT", "SETNAME", name)]) == [b"OK"]
    _kill(redis_url, name)
    # The pooled connection is dead; the client's retry takes a new one (no name).
    assert redis_wire.send(pool, [("SET", key, "after"), ("GET", key), ("CLIENT", "GETNAME")]) \
        == [b"OK", b"after", None]


def test_a_script_redis_forgot_is_loaded_and_run_again(client: Any, key: str) -> None:
    lua = f"-- {key}\nreturn redis.call('INCR', KEYS[1])"
    assert run_script(client, lua, [key], []) == 1
    client.script_flush()
    assert not client.script_exists(script_sha(lua))[0]
    assert run_script(client, lua, [key], []) == 2


def test_clients_it_does_not_know_keep_their_own_path(redis_url: str) -> None:
    import redis

    class Instrumented(redis.Redis):  # type: ignore[type-arg]
        pass

    single = redis.Redis.from_url(redis_url, single_connection_client=True)
    try:
        assert redis_wire.pool_of(Instrumented.from_url(redis_url)) is None
        assert redis_wire.pool_of(single) is None
        assert redis_wire.pool_of(object()) is None
    finally:
        single.close()


def test_a_transaction_gives_each_reply_and_a_refused_command_aborts_it(
        client: Any, key: str) -> None:
    pool = redis_wire.pool_of(client)
    replies = redis_wire.transaction(client, [
        ("SET", key, "1"), ("EVALSHA", "0" * 40, 0), ("INCR", key)])
    assert replies[0] == b"OK" and replies[2] == 2
    assert type(replies[1]).__name__ == "NoScriptError"  # a run-time error stays in place
    with pytest.raises(Exception, match="wrong number of arguments"):
        redis_wire.transaction(client, [("INCR", key), ("GET",)])
    assert client.get(key) == b"2"  # the refused block ran nothing
    assert redis_wire.send(pool, [("PING",)]) == [b"PONG"]  # and left the connection in step


def test_a_client_whose_commands_a_tracer_wrapped_keeps_its_path(
        redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import functools

    import redis

    original = redis.Redis.execute_command

    @functools.wraps(original)
    def traced(self: Any, *args: Any, **options: Any) -> Any:  # as wrapt and friends do
        return original(self, *args, **options)

    monkeypatch.setattr(redis.Redis, "execute_command", traced)
    client = redis.Redis.from_url(redis_url)
    try:
        assert redis_wire.pool_of(client) is None
    finally:
        client.close()


def test_in_one_batch_a_forgotten_script_is_reloaded_and_a_known_one_runs_once(
        client: Any, key: str) -> None:
    from ojs_adapters.runtime.group_commit import _on_wire

    known = f"-- known {key}\nreturn redis.call('INCR', KEYS[1])"
    forgotten = f"-- forgotten {key}\nreturn redis.call('INCRBY', KEYS[1], 10)"
    client.script_load(known)
    assert not client.script_exists(script_sha(forgotten))[0]
    replies = _on_wire(redis_wire.Line(), redis_wire.pool_of(client),
                       [(known, [key], []), (forgotten, [key], [])])
    assert replies == [1, 11] and client.get(key) == b"11"


def test_a_client_wrapped_on_its_own_keeps_its_path(redis_url: str) -> None:
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        client.execute_command = client.execute_command  # type: ignore[method-assign]
        assert redis_wire.pool_of(client) is None
    finally:
        client.close()


def test_a_client_it_leaves_alone_gets_the_same_transaction_through_its_pipeline(
        redis_url: str, key: str) -> None:
    import redis

    class Own(redis.Redis):  # type: ignore[type-arg]
        pass

    client = Own.from_url(redis_url)
    try:
        assert redis_wire.pool_of(client) is None
        replies = redis_wire.transaction(client, [
            ("SET", key, "1"), ("EVALSHA", "0" * 40, 0), ("INCR", key)])
        assert replies[2] == 2 and type(replies[1]).__name__ == "NoScriptError"
        with pytest.raises(Exception, match="wrong number of arguments"):
            redis_wire.transaction(client, [("INCR", key), ("GET",)])
        assert client.get(key) == b"2"
    finally:
        client.close()


def test_a_line_keeps_one_connection_and_gives_a_failed_one_back_dropped(
        client: Any, key: str) -> None:
    pool = redis_wire.pool_of(client)
    line = redis_wire.Line()
    assert line.send(pool, [("SET", key, "1")]) == [b"OK"]
    kept = line._conn
    assert kept in pool._in_use_connections  # checked out, not shared with other callers
    assert line.send(pool, [("INCR", key)]) == [2] and line._conn is kept
    import redis

    with pytest.raises(redis.DataError):  # the send failed: its connection is not kept
        line.send(pool, [("SET", key, object())])
    assert line._conn is None and kept not in pool._in_use_connections
    assert line.send(pool, [("GET", key)]) == [b"2"]  # a connection taken anew


_ARG = st.one_of(st.binary(max_size=40), st.text(max_size=40),
                 st.integers(min_value=-2**70, max_value=2**70))


_NAME = st.one_of(st.sampled_from(["EVALSHA", "SET", "MULTI"]), st.text(max_size=12),
                  st.binary(max_size=8))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_NAME, st.lists(_ARG, max_size=6)).map(lambda c: [c[0], *c[1]]),
                min_size=1, max_size=4))
def test_commands_are_packed_as_redis_py_packs_them(commands: list[list[Any]]) -> None:
    import redis

    conn = redis.Connection()
    try:
        expected = b"".join(conn.pack_commands(commands))
    except Exception as error:  # what redis-py refuses, refused the same way
        with pytest.raises(type(error)):
            redis_wire._pack(conn, commands)
        return
    assert b"".join(redis_wire._pack(conn, commands)) == expected


def test_what_the_short_packer_does_not_know_goes_to_redis_py(client: Any, key: str) -> None:
    pool = redis_wire.pool_of(client)
    assert redis_wire.send(pool, [("SET", key, 1.5), ("GET", key)]) == [b"OK", b"1.5"]
    assert redis_wire.send(pool, [("SCRIPT EXISTS", "0" * 40)]) == [[0]]


def test_a_pool_s_connection_is_kept_between_calls_not_checked_out_each_time(
        client: Any, key: str) -> None:
    pool = redis_wire.pool_of(client)
    redis_wire.send(pool, [("SET", key, "1")])
    kept = set(pool._in_use_connections)
    assert len(kept) == 1  # kept here, out of redis-py's pool
    assert redis_wire.send(pool, [("INCR", key)]) == [2]
    assert set(pool._in_use_connections) == kept  # the same one, used again


def test_a_bounded_pool_gets_its_connection_back_after_each_call(
        redis_url: str, key: str) -> None:
    import redis

    client = redis.Redis.from_url(redis_url, max_connections=4)
    try:
        pool = redis_wire.pool_of(client)
        assert redis_wire.send(pool, [("SET", key, "1"), ("GET", key)]) == [b"OK", b"1"]
        assert not pool._in_use_connections
    finally:
        client.delete(key)
        client.close()


def _in_child(check: Any) -> int:
    """Run ``check()`` in a forked child; its exit code (0 when it returned True)."""
    import os

    child = os.fork()
    if child == 0:
        try:
            os._exit(0 if check() else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status)


def test_a_forked_child_does_not_write_on_its_parents_connections(
        client: Any, key: str) -> None:
    pool = redis_wire.pool_of(client)
    name = f"ojs-parent-{uuid.uuid4().hex[:8]}"
    assert redis_wire.send(pool, [("CLIENT", "SETNAME", name)]) == [b"OK"]  # kept
    line = redis_wire.Line()
    assert line.send(pool, [("CLIENT", "SETNAME", name)]) == [b"OK"]
    # the child's calls go out on connections of its own: no name on them
    assert _in_child(lambda: redis_wire.send(pool, [("CLIENT", "GETNAME")]) == [None]) == 0
    assert _in_child(lambda: line.send(pool, [("CLIENT", "GETNAME")]) == [None]) == 0
    assert redis_wire.send(pool, [("CLIENT", "GETNAME")]) == [name.encode()]
    assert line.send(pool, [("CLIENT", "GETNAME")]) == [name.encode()]


def test_a_line_whose_new_connection_cannot_be_had_holds_none(
        client: Any, key: str, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import redis

    pool = redis_wire.pool_of(client)
    line = redis_wire.Line()
    name = f"ojs-line-{uuid.uuid4().hex[:8]}"
    assert line.send(pool, [("CLIENT", "SETNAME", name)]) == [b"OK"]
    kept = line._conn
    _kill(redis_url, name)
    monkeypatch.setattr(pool, "get_connection", lambda: (_ for _ in ()).throw(
        redis.ConnectionError("still restarting")))
    with pytest.raises(redis.ConnectionError):
        line.send(pool, [("PING",)])
    # the dead connection went back to the pool: the line must not hold it too
    assert line._conn is None and kept in pool._available_connections
    monkeypatch.undo()
    assert line.send(pool, [("PING",)]) == [b"PONG"]  # checked out anew, held by one user
    assert line._conn in pool._in_use_connections
    assert line._conn not in pool._available_connections


def test_a_small_pool_keeps_nothing_out_for_group_commit_or_send(
        redis_url: str, key: str) -> None:
    import redis

    client = redis.Redis.from_url(redis_url, max_connections=8)
    try:
        pool = redis_wire.pool_of(client)
        assert redis_wire.keepable(pool) == 0
        assert run_script(client, f"-- {key}\nreturn redis.call('INCR', KEYS[1])",
                          [key], []) == 1
        assert redis_wire.send(pool, [("GET", key)]) == [b"1"]
        assert not pool._in_use_connections
    finally:
        client.delete(key)
        client.close()


def test_pools_whose_release_does_more_keep_nothing(redis_url: str) -> None:
    import redis
    from redis.cache import CacheConfig
    from redis.credentials import UsernamePasswordCredentialProvider

    for client in (redis.Redis.from_url(redis_url, protocol=3, cache_config=CacheConfig()),
                   redis.Redis.from_url(redis_url, credential_provider=(
                       UsernamePasswordCredentialProvider()))):
        try:
            assert redis_wire.keepable(client.connection_pool) == 0
        finally:
            client.close()
    # RESP3 (redis-py 8's default) and RESP2 alike: _checked does what release would
    for kept in (redis.Redis.from_url(redis_url), redis.Redis.from_url(redis_url, protocol=3),
                 redis.Redis.from_url(redis_url, protocol=2)):
        try:
            assert redis_wire.keepable(kept.connection_pool) == 100 // 16
        finally:
            kept.close()


def test_threads_racing_on_fresh_pools_lose_no_connection(redis_url: str) -> None:
    import threading

    import redis

    clients = [redis.Redis.from_url(redis_url) for _ in range(20)]
    pools = [redis_wire.pool_of(c) for c in clients]
    start = threading.Barrier(8)

    def hammer() -> None:
        start.wait()
        for pool in pools:
            assert redis_wire.send(pool, [("PING",)]) == [b"PONG"]

    threads = [threading.Thread(target=hammer) for _ in range(8)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for pool in pools:  # every connection out of the pool is a kept one
            kept = pool._ojs_wire_kept[2]
            assert set(pool._in_use_connections) == set(kept)
            assert len(kept) <= redis_wire.keepable(pool)
    finally:
        for c in clients:
            c.close()


def test_group_commit_replaces_its_kept_connection_once_the_server_closed_it(
        client: Any, key: str, redis_url: str) -> None:
    from ojs_adapters.runtime.group_commit import group_of

    lua = f"-- {key}\nreturn redis.call('INCR', KEYS[1])"
    assert run_script(client, lua, [key], []) == 1
    name = f"ojs-line-{uuid.uuid4().hex[:8]}"
    pool = redis_wire.pool_of(client)
    assert group_of(client)._line.send(pool, [("CLIENT", "SETNAME", name)]) == [b"OK"]
    _kill(redis_url, name)
    assert run_script(client, lua, [key], []) == 2  # on a new connection, no error


def test_a_kept_connection_marked_for_reconnection_is_not_used_again(
        client: Any, key: str) -> None:
    """A maintenance notice (redis-py's ``mark_for_reconnect``) makes ``release`` drop a
    connection; a kept one, never released between calls, is dropped on its next use."""
    pool = redis_wire.pool_of(client)
    assert redis_wire.send(pool, [("SET", key, "1")]) == [b"OK"]
    (kept,) = pool._ojs_wire_kept[2]
    if not hasattr(kept, "mark_for_reconnect"):
        pytest.skip("redis-py before 6.3 has no maintenance notices")
    old_socket = kept._sock
    kept.mark_for_reconnect()
    assert redis_wire.send(pool, [("INCR", key)]) == [2]
    (now,) = pool._ojs_wire_kept[2]
    assert now._sock is not None and now._sock is not old_socket  # dropped, connected anew
    assert old_socket.fileno() == -1  # the old socket closed, not left open


def test_a_kept_connection_its_pool_no_longer_owns_is_not_used_again(redis_url: str) -> None:
    """A Sentinel pool disowns its connections to a demoted master (``owns_connection``),
    and ``release`` drops them; a kept one is dropped on its next use."""
    import redis

    class Pool(redis.ConnectionPool):
        owned = True

        def owns_connection(self, connection: Any) -> Any:
            return self.owned and super().owns_connection(connection)

    client = redis.Redis(connection_pool=Pool.from_url(redis_url))
    key = f"ojs-test:owned:{uuid.uuid4().hex}"
    try:
        pool = redis_wire.pool_of(client)
        assert redis_wire.send(pool, [("SET", key, "1")]) == [b"OK"]
        (old,) = pool._ojs_wire_kept[2]
        old_socket = old._sock
        pool.owned = False  # a failover: the master this connection reaches is demoted
        assert redis_wire.send(pool, [("INCR", key)]) == [2]
        (now,) = pool._ojs_wire_kept[2]
        assert now is not old and old_socket.fileno() == -1
    finally:
        client.delete(key)
        client.close()


def test_a_connection_lost_midway_sends_again_only_the_unanswered_commands(
        key: str, redis_url: str) -> None:
    """A batch holds other threads' scripts: one whose reply was read ran, and must not run
    a second time when the connection is lost after it (the client's retry)."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    admin = redis.Redis.from_url(redis_url)
    client = redis.Redis.from_url(redis_url, retry=Retry(NoBackoff(), 3))  # as Dramatiq's
    pool = redis_wire.pool_of(client)
    name = f"ojs-wire-{uuid.uuid4().hex[:8]}"
    try:
        assert redis_wire.send(pool, [("CLIENT", "SETNAME", name)]) == [b"OK"]
        own = next(c["id"] for c in admin.client_list() if c.get("name") == name)
        # Redis answers the kill, then closes this connection: the last INCR is unanswered.
        replies = redis_wire.send(pool, [("CLIENT", "GETNAME"), ("INCR", key),
                                         ("CLIENT", "KILL", "ID", own, "SKIPME", "no"),
                                         ("INCR", key + ":after")])
        assert admin.get(key) == b"1", "an answered command ran again"
        assert admin.get(key + ":after") == b"1"
        assert replies == [name.encode(), 1, 1, 1]
    finally:
        admin.delete(key + ":after")
        admin.close()
        client.close()


class _Server:
    """A connection to a pretend Redis that runs each command as its reply is read (a counter
    per key; a MULTI block applied at EXEC), and drops the link once, after ``drop_after``
    replies: what was not read never ran."""

    class encoder:  # redis-py's attribute name
        encoding, encoding_errors = "utf-8", "strict"

    def __init__(self, drop_after: int, retries: int) -> None:
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self.retry = Retry(NoBackoff(), retries)
        self.counts: dict[str, int] = {}
        self.sent: list[list[str]] = []
        self.queued: list[str] | None = None
        self.read = 0
        self.drop_after: int | None = drop_after

    def send_packed_command(self, packed: list[bytes]) -> None:
        parts = iter(b"".join(packed).split(b"\r\n"))
        self.sent += [[next(parts) and next(parts).decode() for _ in range(int(head[1:]))]
                      for head in parts if head.startswith(b"*")]

    def read_response(self) -> Any:
        import redis

        if self.drop_after is not None and self.read == self.drop_after:
            self.drop_after = None
            self.disconnect()
            raise redis.ConnectionError("dropped")
        self.read += 1
        name, *args = self.sent.pop(0)
        if name == "MULTI":
            self.queued = []
            return b"OK"
        if name == "EXEC":
            if self.queued is None:
                return redis.ResponseError("ERR EXEC without MULTI")
            done, self.queued = [self._incr(k) for k in self.queued], None
            return done
        if self.queued is not None:
            self.queued.append(args[0])
            return b"QUEUED"
        return self._incr(args[0])

    def _incr(self, key: str) -> int:
        self.counts[key] = self.counts.get(key, 0) + 1
        return self.counts[key]

    def disconnect(self) -> None:
        self.sent, self.queued = [], None


def test_a_multi_block_cut_short_is_sent_again_whole_and_answered_replies_are_kept() -> None:
    """A MULTI block's commands ran only if its EXEC was answered: a retry sends the block
    again from MULTI (its suffix alone would be an EXEC without MULTI). A send whose retries
    run out says which commands answered (``answered``): they ran."""
    import redis

    conn = _Server(drop_after=2, retries=1)  # MULTI and QUEUED read, then the link drops
    replies = redis_wire._send_on(conn, [("MULTI",), ("INCR", "a"), ("EXEC",)])
    assert replies == [b"OK", b"QUEUED", [1]] and conn.counts == {"a": 1}

    conn = _Server(drop_after=1, retries=0)
    with pytest.raises(redis.ConnectionError) as cut:
        redis_wire._send_on(conn, [("INCR", "a"), ("INCR", "b")])
    assert redis_wire.answered(cut.value) == [1]
