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

import contextlib
import os
import sys
import threading
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

    A few connections of a large pool wait here between calls instead of going back to
    it (``keepable``): a checkout from redis-py's pool and its release cost 10-14 µs a
    call, a poll of the socket among it.
    """
    kept = _kept_of(pool)
    conn = None
    if kept is not None:
        with contextlib.suppress(IndexError):  # none left: another thread took the last
            conn = kept[2].pop()
    conn = pool.get_connection() if conn is None else _checked(pool, conn)
    try:
        replies = _send_on(conn, commands)
    except BaseException:
        conn.disconnect()
        pool.release(conn)
        raise
    if kept is None or _marked(conn) or not _keep(kept, conn):
        pool.release(conn)  # a connection a notice marked during the call: dropped there
    return replies


#: Connections kept out of one pool between ``send`` calls at most (about one per worker
#: thread), and never more than a sixteenth of the pool's bound.
KEPT = 8
#: The attribute of a pool holding its kept connections: (pid, how many, the list).
_KEPT_ATTRIBUTE = "_ojs_wire_kept"
_KEPT_LOCK = threading.Lock()


def keepable(pool: Any) -> int:
    """How many connections of ``pool`` may stay out of it between calls: a sixteenth of
    its ``max_connections`` (redis-py's default 100: 6), at most ``KEPT``. None of a pool
    whose ``release`` does more than ``_checked`` does for a kept one: client-side caching,
    a credential provider (rotated passwords). RESP3, redis-py 8's default, keeps them:
    a maintenance notice waiting on one is read by its next reply's read, as on a
    connection the pool hands out, and one the notice marks is dropped, as by ``release``."""
    bound = getattr(pool, "max_connections", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if type(bound) is not int or not isinstance(kwargs, dict):
        return 0
    if getattr(pool, "cache", None) is not None or kwargs.get("credential_provider") is not None:
        return 0
    return min(KEPT, bound // 16)


def _kept_of(pool: Any) -> tuple[int, int, list[Any]] | None:
    """``pool``'s kept connections, made once per process (a forked child starts with
    none: its parent's sockets are the parent's); ``None`` if it keeps none."""
    found: tuple[int, int, list[Any]] | None = getattr(pool, _KEPT_ATTRIBUTE, None)
    pid = os.getpid()
    if found is None or found[0] != pid:
        with _KEPT_LOCK:
            found = getattr(pool, _KEPT_ATTRIBUTE, None)
            if found is None or found[0] != pid:
                found = (pid, keepable(pool), [])
                try:  # on the pool itself: it goes when the pool goes
                    setattr(pool, _KEPT_ATTRIBUTE, found)
                except AttributeError:
                    return None
    return found if found[1] else None


def _keep(kept: tuple[int, int, list[Any]], conn: Any) -> bool:
    with _KEPT_LOCK:
        if len(kept[2]) >= kept[1]:
            return False
        kept[2].append(conn)
        return True


def _checked(pool: Any, conn: Any) -> Any:
    """``conn`` if it is still in step, as redis-py's pool checks a connection it hands out
    and takes back; else given back dropped, and a new one of ``pool``. Not in step: closed
    by the server (a restart, an idle timeout), marked for reconnection by a maintenance
    notice (redis-py 6.3+), no longer the pool's (a Sentinel pool's old master after a
    failover), or with something to read where no notices are expected. Where they are
    (RESP3), what waits is a notice: the next reply's read handles it first."""
    try:
        stale = _marked(conn) or not _owned(pool, conn) or (
            conn.can_read() and not _notices_on(pool))
    except Exception:  # closed by the server: ``can_read`` raises
        stale = True
    if not stale:
        return conn
    conn.disconnect()
    pool.release(conn)
    return pool.get_connection()


def _marked(conn: Any) -> bool:
    """Whether a maintenance notice marked ``conn`` for reconnection (``release`` drops it)."""
    marked = getattr(conn, "should_reconnect", None)
    return bool(marked is not None and marked())


def _owned(pool: Any, conn: Any) -> bool:
    """Whether ``pool`` would take ``conn`` back (``release`` drops one it does not own)."""
    owns = getattr(pool, "owns_connection", None)
    return owns is None or bool(owns(conn))


def _notices_on(pool: Any) -> bool:
    """Whether ``pool``'s connections read maintenance notices (RESP3 pushes, redis-py 6.3+:
    ``True`` or ``"auto"``), as ``get_connection`` asks before it calls one stale."""
    enabled = getattr(pool, "maint_notifications_enabled", None)
    return bool(enabled is not None and enabled())


class Line:
    """One connection of a pool kept between the sends of a caller that sends one batch
    at a time (group commit's leader), where the pool allows it (``keepable``). A failed
    send gives the connection back (dropped); the next one takes another. A forked child
    forgets its parent's connection (the socket is the parent's)."""

    __slots__ = ("_conn", "_pid", "_pool")

    def __init__(self) -> None:
        self._conn: Any = None
        self._pool: Any = None
        self._pid = 0

    def send(self, pool: Any, commands: Sequence[Sequence[Any]]) -> list[Any]:
        """As module-level ``send``, on the kept connection (of ``pool`` or of another
        pool with the same settings)."""
        conn, self._conn = self._conn, None  # held by no one while in doubt
        if conn is not None and self._pid == os.getpid():
            conn = _checked(self._pool, conn)
        elif keepable(pool):
            conn, self._pool, self._pid = pool.get_connection(), pool, os.getpid()
        else:
            return send(pool, commands)
        try:
            replies = _send_on(conn, commands)
        except BaseException:
            conn.disconnect()
            self._pool.release(conn)
            raise
        try:
            if _marked(conn):  # a notice read with the replies: dropped, as by ``release``
                self._pool.release(conn)
            else:
                self._conn = conn
        except BaseException as error:  # raised into this thread: the commands ran
            set_answered(error, replies)
            raise
        return replies


#: Attribute of an error that ended a send: the replies read before it.
_ANSWERED = "_ojs_answered"


def _send_on(conn: Any, commands: Sequence[Sequence[Any]]) -> list[Any]:
    """The replies of ``commands``; a connection lost midway (with the client's retry)
    sends again only the commands whose replies were not read: one answered ran, and
    must not run twice (a batch holds other threads' scripts). A ``MULTI`` block is sent
    again whole: its commands run at ``EXEC`` (one whose ``EXEC`` ran but whose reply was
    lost runs twice, as in redis-py's own transaction retry)."""
    replies: list[Any] = []
    whole = bool(commands) and str(commands[0][0]).upper() == "MULTI"

    def attempt() -> list[Any]:
        if whole:
            del replies[:]
        left = commands[len(replies):]
        _exchange(conn, _pack(conn, left), len(left), replies)
        return replies

    retry = getattr(conn, "retry", None)
    try:
        if retry is None:
            return attempt()
        return retry.call_with_retry(  # type: ignore[no-any-return]
            attempt, lambda *_: conn.disconnect())
    except BaseException as error:  # what did run, for the callers it belongs to
        set_answered(error, [] if whole else replies)
        raise


def answered(error: BaseException) -> list[Any]:
    """The replies read before ``error`` ended a ``send``: those commands ran."""
    found: list[Any] = getattr(error, _ANSWERED, [])
    return found


def set_answered(error: BaseException, replies: Sequence[Any]) -> None:
    """Let ``error`` carry the replies read before it (``answered``); an exception that
    takes no attributes carries none."""
    with contextlib.suppress(Exception):
        setattr(error, _ANSWERED, list(replies))


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
        name = command[0] if command else None
        if type(name) is not str or not name.isalpha():
            return conn.pack_commands(commands)  # redis-py splits "SCRIPT LOAD", drops ""
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


def _exchange(conn: Any, packed: Any, replies_due: int, replies: list[Any]) -> None:
    """Send ``packed`` and append its ``replies_due`` replies to ``replies`` as they are
    read (an error reply as its exception)."""
    conn.send_packed_command(packed)
    for _ in range(replies_due):
        try:
            replies.append(conn.read_response())
        except Exception as error:
            if not is_reply_error(error):
                raise
            replies.append(error)


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
