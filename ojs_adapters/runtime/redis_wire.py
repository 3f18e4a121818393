"""Redis commands written straight to a pooled connection of a redis-py client.

redis-py's ``execute_command`` runs each command through its retry loop, its
observability records and its response callbacks: about 45 µs of CPU a call here,
twice the write and the read themselves (docs/cost.md). The scripts on an attempt's
path need none of it: their replies are raw, and ``BackendRetry`` retries a failed
call. ``send`` packs the commands, writes them at once on a connection of the
client's own pool (its settings, credentials and TLS) and reads every reply.

Only redis-py's own client class (6 or later, its command paths not wrapped by a
tracer) goes this way; anything else (a subclass, a single-connection client, an
asyncio or cluster client, a test double) gets ``None`` from ``pool_of`` and its
callers use the client's public API.
"""

from __future__ import annotations

import os
import sys
import weakref
from collections.abc import Sequence
from typing import Any

#: ``pool_of``'s answer per client object.
_POOLS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_NO_POOL = object()


def pool_of(client: Any) -> Any:
    """The connection pool ``send`` may use for ``client``, or ``None``."""
    try:
        known = _POOLS.get(client)
    except TypeError:  # not weakly referable
        return None
    if known is None:
        known = _POOLS[client] = _plain_pool(client)
    return None if known is _NO_POOL else known


def _plain_pool(client: Any) -> Any:
    cls = type(client)
    if cls.__module__ != "redis.client" or cls.__name__ not in ("Redis", "StrictRedis") \
            or not _untouched(client):
        return _NO_POOL
    if getattr(client, "connection", None) is not None:  # single_connection_client
        return _NO_POOL
    if "execute_command" in vars(client):  # wrapped on this client alone
        return _NO_POOL
    pool = getattr(client, "connection_pool", None)
    if not (hasattr(pool, "get_connection") and hasattr(pool, "release")):
        return _NO_POOL
    return pool


def _untouched(client: Any) -> bool:
    """Whether redis-py is 6 or later (its retry covers connection errors, as ``send``'s
    does) and nobody wrapped its command paths (tracing: OpenTelemetry, ddtrace, Sentry),
    whose calls must keep going through them."""
    module = sys.modules.get("redis.client")
    version = getattr(sys.modules.get("redis"), "__version__", "0")
    if module is None or not version.split(".")[0].isdigit() or int(version.split(".")[0]) < 6:
        return False
    return all(getattr(fn, "__module__", None) == "redis.client" and
               not hasattr(fn, "__wrapped__")
               for fn in (type(client).execute_command, module.Pipeline.execute,
                          module.Pipeline.execute_command))


def send(pool: Any, commands: Sequence[Sequence[Any]]) -> list[Any]:
    """Write ``commands`` in one go on a connection of ``pool`` and read their replies,
    in order.

    An error reply (``NOSCRIPT``, a script's error) comes back as its exception
    object, in its place. A connection failure is retried as the client's own
    ``retry`` says (as ``execute_command`` does), the connection dropped first, so
    nothing is half read; then raised.

    Up to ``KEPT`` connections of a pool that allows ``KEPT_FROM`` or more wait here
    between calls instead of going back to it: a checkout from redis-py's pool and its
    release cost 14 µs a call, a poll of the socket among it.
    """
    kept = _kept_of(pool)
    try:
        conn = _checked(pool, kept.pop()) if kept else pool.get_connection()
    except IndexError:  # another thread took the last one meanwhile
        conn = pool.get_connection()  # redis-py 6+ (``pool_of``): no command name
    try:
        replies = _send_on(conn, commands)
    except BaseException:
        conn.disconnect()
        pool.release(conn)
        raise
    if kept is not None and len(kept) < KEPT:
        kept.append(conn)
    else:
        pool.release(conn)
    return replies


#: Connections kept per pool between ``send`` calls (about one per worker thread).
KEPT = 8
#: Smallest ``max_connections`` of a pool whose connections ``send`` keeps (redis-py's
#: default is 100; a small bound is its owner's to ration).
KEPT_FROM = 32
#: Per pool: the process that kept them, and the kept connections.
_KEPT: weakref.WeakKeyDictionary[Any, tuple[int, list[Any]]] = weakref.WeakKeyDictionary()


def _kept_of(pool: Any) -> list[Any] | None:
    """The kept connections of ``pool``, or ``None`` if it keeps none; a forked child
    starts with none (its parent's sockets are the parent's)."""
    try:
        found = _KEPT.get(pool)
    except TypeError:
        return None
    pid = os.getpid()
    if found is None or found[0] != pid:
        bound = getattr(pool, "max_connections", 0)
        if not isinstance(bound, int) or bound < KEPT_FROM:
            return None
        found = _KEPT[pool] = (pid, [])
    return found[1]


def _checked(pool: Any, conn: Any) -> Any:
    """``conn`` if it is still in step, as redis-py's pool checks a connection it hands
    out (nothing left to read, not closed by the server: a restart, an idle timeout);
    else given back dropped, and a new one of ``pool``."""
    try:
        stale = conn.can_read()
    except Exception:
        stale = True
    if not stale:
        return conn
    conn.disconnect()
    pool.release(conn)
    return pool.get_connection()


class Line:
    """One connection of a pool, kept between the sends of a caller that sends one batch
    at a time (group commit's leader, one thread): a pool checkout and release cost 14 µs
    a call here. A failed send gives the connection back (dropped); the next one takes
    another. A forked child forgets its parent's connection (the socket is the parent's)."""

    __slots__ = ("_conn", "_pid", "_pool")

    def __init__(self) -> None:
        self._conn: Any = None
        self._pool: Any = None
        self._pid = 0

    def send(self, pool: Any, commands: Sequence[Sequence[Any]]) -> list[Any]:
        """As module-level ``send``, on the kept connection (of ``pool`` or of another
        pool with the same settings)."""
        conn = self._conn
        if conn is None or self._pid != os.getpid():
            conn = pool.get_connection()
            self._conn, self._pool, self._pid = conn, pool, os.getpid()
        else:
            conn = self._conn = _checked(self._pool, conn)
        try:
            return _send_on(conn, commands)
        except BaseException:
            self._conn = None
            conn.disconnect()
            self._pool.release(conn)
            raise


def _send_on(conn: Any, commands: Sequence[Sequence[Any]]) -> list[Any]:
    packed = _pack(conn, commands)
    retry = getattr(conn, "retry", None)
    if retry is None:
        return _exchange(conn, packed, len(commands))
    return retry.call_with_retry(  # type: ignore[no-any-return]
        lambda: _exchange(conn, packed, len(commands)), lambda *_: conn.disconnect())


def _pack(conn: Any, commands: Sequence[Sequence[Any]]) -> Any:
    """The commands in RESP, as redis-py's encoder writes them; bytes, ``str`` (UTF-8,
    strict) and ``int`` arguments packed here at a third of its cost, anything else by
    ``conn.pack_commands``."""
    encoder = getattr(conn, "encoder", None)
    if getattr(encoder, "encoding", None) not in ("utf-8", "utf8") \
            or getattr(encoder, "encoding_errors", None) != "strict":
        return conn.pack_commands(commands)
    out: list[bytes] = []
    for command in commands:
        if not command or (isinstance(command[0], str) and " " in command[0]):
            return conn.pack_commands(commands)  # redis-py splits "SCRIPT LOAD"
        out.append(b"*%d\r\n" % len(command))
        for arg in command:
            kind = type(arg)
            if kind is bytes:
                data = arg
            elif kind is str:
                data = arg.encode()
            elif kind is int:
                data = b"%d" % arg
            else:
                return conn.pack_commands(commands)
            out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return [b"".join(out)]


def _exchange(conn: Any, packed: Any, replies_due: int) -> list[Any]:
    conn.send_packed_command(packed)
    replies: list[Any] = []
    for _ in range(replies_due):
        try:
            replies.append(conn.read_response())
        except Exception as error:
            if not is_reply_error(error):
                raise
            replies.append(error)
    return replies


def is_reply_error(error: BaseException) -> bool:
    """Whether ``error`` is an error *reply* from Redis (the connection is still good)."""
    return any(cls.__name__ == "ResponseError" for cls in type(error).__mro__)


def transaction(client: Any, commands: Sequence[Sequence[Any]]) -> list[Any]:
    """``commands`` in one ``MULTI``/``EXEC``; each command's reply (an error as its
    exception object). A command Redis refused to queue aborts the whole block: its error
    is raised, as redis-py's transactions do. One write on ``pool_of(client)``; a client
    this module leaves alone goes through its own ``pipeline``."""
    pool = pool_of(client)
    if pool is None:
        with client.pipeline(transaction=True) as pipe:
            for command in commands:
                pipe.execute_command(*command)
            return list(pipe.execute(raise_on_error=False))
    replies = send(pool, [("MULTI",), *commands, ("EXEC",)])
    done = replies[-1]
    if isinstance(done, BaseException) or done is None:
        refused = [reply for reply in replies[1:-1] if isinstance(reply, BaseException)]
        raise refused[0] if refused else done or RuntimeError("EXEC answered nil")
    return list(done)
