"""Group commit: the Redis scripts of concurrent worker threads sent as one pipeline.

Every attempt calls two scripts (admission, outcome save); with several worker
threads these calls overlap. ``run_script`` queues a call; the first caller with no
flush in progress sends every queued call as one pipeline, hands each thread its own
reply, and passes the lead to a thread that queued meanwhile. Each caller still gets
its own reply (or error) before it returns, so no guarantee changes: only the round
trips are shared (docs/cost.md). Alone, a call goes out at once, as before.

On redis-py's own clients the batch is written straight to a connection the group keeps
(``redis_wire``); other clients get their own ``evalsha`` and ``pipeline``. The client
is passed in; nothing here imports redis.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import weakref
from collections.abc import Sequence
from typing import Any

from ojs_adapters.runtime import redis_wire

#: Calls sent in one pipeline at most (a bound on one flush's reply size and latency).
MAX_BATCH = 64


#: A call's reply before its flush gave it one.
_UNSENT: Any = object()


class _Call:
    """One queued script call and, once flushed, its reply or error."""

    __slots__ = ("args", "client", "done", "error", "gate", "keys", "lua", "reply")

    def __init__(self, client: Any, lua: str, keys: Sequence[Any], args: Sequence[Any]) -> None:
        self.client, self.lua, self.keys, self.args = client, lua, keys, args
        self.reply: Any = _UNSENT
        self.error: BaseException | None = None
        self.done = False
        self.gate = threading.Lock()  # held until this call is done, or its thread leads
        self.gate.acquire()

    def wake(self) -> None:
        """Let the caller go on (again: no effect)."""
        with contextlib.suppress(RuntimeError):  # woken already
            self.gate.release()

    def outcome(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.reply


class GroupCommit:
    """The call queue of one Redis server and database (see the module docstring).

    Clients with the same connection settings share it: Celery gives each worker
    thread a result backend, and so a Redis client, of its own. A flush goes through
    the client of the call that leads it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: list[_Call] = []
        #: Who leads (on the wire, or woken to lead the next flush); ``None``: idle.
        self._baton: Any = None
        self._line = redis_wire.Line()  # the connection of whoever is on the wire

    def run(self, client: Any, lua: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """Run the Lua script ``lua`` on ``keys`` and ``args``; its reply, or its error.

        An exception raised into this thread from outside (Dramatiq's ``TimeLimit``, a
        shutdown) never leaves the group without a leader or a flush half done: the lead
        is handed on, and the other callers of a flush it cut short retry theirs."""
        alone: Any = None  # this caller's baton when it goes out alone
        call = None
        leaving = False  # an exception is on its way up: a queued call leaves
        try:
            with self._lock:
                if self._baton is None:
                    self._baton = alone = object()
                else:
                    call = _Call(client, lua, keys, args)
                    self._queue.append(call)
            if alone is not None:  # nothing in flight: straight out, as without group commit
                pool = redis_wire.pool_of(client)
                if pool is None:
                    return _evalsha(client, lua, keys, args)
                reply = _on_wire(self._line, pool, [(lua, keys, args)])[0]
                if isinstance(reply, BaseException):
                    raise reply
                return reply
            assert call is not None
            call.gate.acquire()  # woken when done, or to lead the next flush
            if not call.done:
                self._lead(call)
            return call.outcome()
        except BaseException:
            leaving = True
            raise
        finally:
            # The lead must not stay with a caller that is done or left: the step that hands
            # it on runs again until it ends, though an exception is raised into this
            # thread meanwhile (and goes on up after). Written out here, not in a helper: an
            # exception can land as any function starts, before its ``try``. Not covered: a
            # second one landing on the loop's jump back (two within microseconds).
            if alone is not None or (leaving and call is not None):
                raised: BaseException | None = None
                while True:
                    try:
                        if alone is not None:
                            self._hand_on(alone)
                        elif call is not None and not call.done:
                            self._leave(call)
                        break
                    except BaseException as error:
                        raised = raised or error
                if raised is not None:
                    raise raised from None

    def _hand_on(self, holder: Any) -> None:
        """``holder`` is done leading: wake the first queued call to lead the next flush, or
        go idle. Again, after the lead moved on: it only wakes the leader again."""
        with self._lock:
            if self._baton is holder:
                if self._queue:
                    self._baton = self._queue[0]
                else:
                    self._baton = None
            if isinstance(self._baton, _Call):
                self._baton.wake()

    def _leave(self, call: _Call) -> None:
        """Take ``call`` out of the queue (its thread is leaving) and, if it was woken to
        lead, hand the lead on as it would have."""
        with self._lock:
            if call in self._queue:
                self._queue.remove(call)
        self._hand_on(call)

    def _lead(self, mine: _Call) -> None:
        batch: list[_Call] = []

        def settle() -> None:  # every call of the batch answered and woken, the lead on
            for call in batch:
                if call.reply is _UNSENT and call.error is None:
                    # The flush was cut short by an exception raised into this thread (it
                    # goes on up here): to the others, a connection lost mid-call.
                    call.error = ConnectionError("the flush carrying this call was cut short")
                call.done = True
                call.wake()
            self._hand_on(mine)

        try:
            with self._lock:
                batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
            self._flush(batch)
        except BaseException as error:  # raised into this thread mid-flush: it goes on up
            _answer(batch, error, rest=None)  # a call whose script ran keeps its reply
            raise
        finally:
            raised: BaseException | None = None
            while True:  # to its end, as the hand-on in ``run``
                try:
                    settle()
                    break
                except BaseException as error:
                    raised = raised or error
            if raised is not None:
                raise raised from None

    def _flush(self, batch: list[_Call]) -> None:
        client = batch[0].client
        try:
            pool = redis_wire.pool_of(client)
            if pool is not None:
                replies = _on_wire(self._line, pool,
                                   [(call.lua, call.keys, call.args) for call in batch])
                try:
                    self._give(batch, replies, pool)
                except BaseException as error:  # raised into this thread: they all ran
                    redis_wire.set_answered(error, replies)
                    raise
                return
            if len(batch) == 1:
                call = batch[0]
                call.reply = _evalsha(client, call.lua, call.keys, call.args)
                return
            pipe = client.pipeline(transaction=False)
            for call in batch:
                pipe.evalsha(script_sha(call.lua), len(call.keys), *call.keys, *call.args)
            replies = pipe.execute(raise_on_error=False)
        except Exception as error:  # the others see the error, and retry as they would alone
            _answer(batch, error, rest=error)
            return
        self._give(batch, replies, pool)

    @staticmethod
    def _give(batch: list[_Call], replies: list[Any], pool: Any) -> None:
        """Each call its reply (or error)."""
        for call, reply in zip(batch, replies, strict=True):
            if _no_script(reply) and pool is None:  # Redis lost its scripts: load, send again
                try:
                    call.reply = _evalsha(call.client, call.lua, call.keys, call.args)
                except Exception as error:
                    call.error = error
            elif isinstance(reply, BaseException):
                call.error = reply
            else:
                call.reply = reply


def _answer(batch: list[_Call], error: BaseException, *, rest: Exception | None) -> None:
    """Each call whose script answered before ``error`` ended the send keeps its reply (it
    ran: retried alone it would run twice); the others get ``rest`` (``None``: left as they
    are). A script Redis did not know, or a reply the send never read, did not run."""
    done = redis_wire.answered(error)
    for i, call in enumerate(batch):
        if call.reply is not _UNSENT or call.error is not None:
            continue  # answered before the error
        reply = done[i] if i < len(done) else _UNSENT
        ran = reply is not _UNSENT and not _no_script(reply) and (
            isinstance(reply, Exception) or not isinstance(reply, BaseException))
        if not ran:  # not read, not known to Redis, or an interrupt standing in its place
            if rest is not None:
                call.error = rest
        elif isinstance(reply, Exception):
            call.error = reply
        else:
            call.reply = reply


#: A script call: its Lua source, keys and arguments.
Script = tuple[str, Sequence[Any], Sequence[Any]]


def _on_wire(line: redis_wire.Line, pool: Any, scripts: Sequence[Script]) -> list[Any]:
    """``EVALSHA`` of each script in one write on ``line``; those Redis does not know
    (NOSCRIPT: a restart, a flush) loaded and sent again, in a second write."""
    def evalsha(lua: str, keys: Sequence[Any], args: Sequence[Any]) -> tuple[Any, ...]:
        return ("EVALSHA", script_sha(lua), len(keys), *keys, *args)

    replies = line.send(pool, [evalsha(*script) for script in scripts])
    again = [i for i, reply in enumerate(replies) if _no_script(reply)]
    if again:  # the others ran: whatever happens now is only the again calls' reply
        sources = list(dict.fromkeys(scripts[i][0] for i in again))
        due = len(sources) + len(again)
        try:
            retried = line.send(pool, [("SCRIPT", "LOAD", lua) for lua in sources]
                                + [evalsha(*scripts[i]) for i in again])
        except BaseException as error:  # what the resend read ran; the rest has the error
            done = redis_wire.answered(error)
            retried = done + [error] * (due - len(done))
            if not isinstance(error, Exception):  # raised into this thread: it goes on up,
                _merge(replies, again, sources, scripts, retried)  # with what ran in order
                redis_wire.set_answered(error, replies)
                raise
        _merge(replies, again, sources, scripts, retried)
    return replies


def _merge(replies: list[Any], again: list[int], sources: list[str],
           scripts: Sequence[Script], retried: list[Any]) -> None:
    """The again calls' replies in their places: the resend's, or its failed load's error."""
    loaded = dict(zip(sources, retried, strict=False))
    for i, reply in zip(again, retried[len(sources):], strict=True):
        failed_load = loaded[scripts[i][0]]
        replies[i] = failed_load if isinstance(failed_load, BaseException) else reply


def _evalsha(client: Any, lua: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
    """``EVALSHA``, loading the script first if Redis does not know it (NOSCRIPT)."""
    sha = script_sha(lua)
    try:
        return client.evalsha(sha, len(keys), *keys, *args)
    except Exception as error:
        if not _no_script(error):
            raise
    client.script_load(lua)
    return client.evalsha(sha, len(keys), *keys, *args)


#: One ``GroupCommit`` per connection settings and process (a forked child starts its own).
_GROUPS: dict[tuple[int, Any], GroupCommit] = {}
_GROUPS_LOCK = threading.Lock()
_SHAS: dict[str, str] = {}


#: ``group_of``'s answer per client object, so the settings are read once per client.
_BY_CLIENT: weakref.WeakKeyDictionary[Any, tuple[int, GroupCommit]] = (
    weakref.WeakKeyDictionary())


def group_of(client: Any) -> GroupCommit:
    """The ``GroupCommit`` this process uses for ``client``'s server and settings."""
    pid = os.getpid()
    try:
        known = _BY_CLIENT.get(client)
    except TypeError:  # not weakly referable
        known = None
    if known is not None and known[0] == pid:
        return known[1]
    settings = _settings(client)
    if settings is None:  # shares with no other client
        group = GroupCommit()
    else:
        with _GROUPS_LOCK:
            group = _GROUPS.setdefault((pid, settings), GroupCommit())
    with contextlib.suppress(TypeError):
        _BY_CLIENT[client] = (pid, group)
    return group


def run_script(client: Any, lua: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
    """Run ``lua`` on ``client``, in a pipeline with other threads' calls if they overlap."""
    return group_of(client).run(client, lua, keys, args)


#: Connection settings held as objects that choose the server or the identity: a pool
#: with one is interchangeable with no other (it gets a group of its own).
_OWN_OBJECTS = ("credential_provider", "ssl_context")


def _settings(client: Any) -> Any:
    """What makes two clients interchangeable: their pool's connection class and plain
    connection settings (host, port, db, credentials, decoding; not per-pool helper
    objects); a Sentinel pool's service and sentinels (its settings name no address: the
    master is found at connect time). ``None``: shared with no other client (no pool, a
    test double say; a credential provider or an SSL context object)."""
    pool: Any = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if not isinstance(kwargs, dict) or any(kwargs.get(name) is not None
                                           for name in _OWN_OBJECTS):
        return None
    plain = (str, bytes, int, float, bool, type(None))
    server: Any = None
    service = getattr(pool, "service_name", None)
    if service is not None:  # Sentinel: the service, and the sentinels that find its master
        try:
            server = (service, getattr(pool, "is_master", True), frozenset(
                (s.connection_pool.connection_kwargs.get("host"),
                 s.connection_pool.connection_kwargs.get("port"))
                for s in pool.sentinel_manager.sentinels))
        except (AttributeError, TypeError):
            return None
    return (getattr(pool, "connection_class", None), server,
            frozenset((k, v) for k, v in kwargs.items() if isinstance(v, plain)))


def script_sha(lua: str) -> str:
    """The SHA1 Redis knows ``lua`` by (``EVALSHA``), computed once per script."""
    sha = _SHAS.get(lua)
    if sha is None:
        sha = _SHAS[lua] = hashlib.sha1(lua.encode()).hexdigest()
    return sha


def _no_script(reply: Any) -> bool:
    """Whether ``reply`` is Redis's NOSCRIPT error (by name: redis is not imported here)."""
    return isinstance(reply, Exception) and (
        type(reply).__name__ == "NoScriptError" or str(reply).startswith("NOSCRIPT"))
