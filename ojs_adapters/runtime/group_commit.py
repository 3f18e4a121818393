"""Group commit: the Redis scripts of concurrent worker threads sent as one pipeline.

Every attempt calls two scripts (admission, outcome save); with several worker
threads these calls overlap. ``run_script`` queues a call; the first caller with no
flush in progress sends every queued call as one pipeline, hands each thread its own
reply, and passes the lead to a thread that queued meanwhile. Each caller still gets
its own reply (or error) before it returns, so no guarantee changes: only the round
trips are shared (docs/cost.md). Alone, a call goes out at once, as before.

The client is passed in; nothing here imports redis.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Sequence
from typing import Any

#: Calls sent in one pipeline at most (a bound on one flush's reply size and latency).
MAX_BATCH = 64


class _Call:
    """One queued script call and, once flushed, its reply or error."""

    __slots__ = ("args", "client", "done", "error", "keys", "lua", "reply", "sha", "woken")

    def __init__(self, client: Any, lua: str, keys: Sequence[Any], args: Sequence[Any]) -> None:
        self.client, self.lua, self.keys, self.args = client, lua, keys, args
        self.sha = _sha(lua)
        self.reply: Any = None
        self.error: BaseException | None = None
        self.done = False
        self.woken = threading.Event()  # set when done, or when this call's thread leads

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
        self._busy = False  # a thread is flushing (it will hand the lead on)

    def run(self, client: Any, lua: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """Run the Lua script ``lua`` on ``keys`` and ``args``; its reply, or its error."""
        call = _Call(client, lua, keys, args)
        with self._lock:
            self._queue.append(call)
            lead = not self._busy
            self._busy = True
        if not lead:
            call.woken.wait()
        if not call.done:  # this thread leads the next flush (its call is in it)
            self._lead()
        return call.outcome()

    def _lead(self) -> None:
        with self._lock:
            batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
        try:
            self._flush(batch)
        finally:
            for call in batch:
                call.done = True
                call.woken.set()
            with self._lock:
                if self._queue:
                    self._queue[0].woken.set()  # not done: it leads the next flush
                else:
                    self._busy = False

    def _flush(self, batch: list[_Call]) -> None:
        try:
            if len(batch) == 1:
                call = batch[0]
                call.reply = self._one(call)
                return
            pipe = batch[0].client.pipeline(transaction=False)
            for call in batch:
                pipe.evalsha(call.sha, len(call.keys), *call.keys, *call.args)
            replies = pipe.execute(raise_on_error=False)
        except BaseException as error:  # every caller sees it and retries as it would alone
            for call in batch:
                call.error = error
            return
        for call, reply in zip(batch, replies, strict=True):
            if _no_script(reply):  # Redis lost its script cache: load it, send again
                try:
                    call.reply = self._one(call)
                except BaseException as error:
                    call.error = error
            elif isinstance(reply, BaseException):
                call.error = reply
            else:
                call.reply = reply

    @staticmethod
    def _one(call: _Call) -> Any:
        client = call.client
        try:
            return client.evalsha(call.sha, len(call.keys), *call.keys, *call.args)
        except Exception as error:
            if not _no_script(error):
                raise
        client.script_load(call.lua)
        return client.evalsha(call.sha, len(call.keys), *call.keys, *call.args)


#: One ``GroupCommit`` per connection settings and process (a forked child starts its own).
_GROUPS: dict[tuple[int, Any], GroupCommit] = {}
_GROUPS_LOCK = threading.Lock()
_SHAS: dict[str, str] = {}


def group_of(client: Any) -> GroupCommit:
    """The ``GroupCommit`` this process uses for ``client``'s server and settings."""
    key = (os.getpid(), _settings(client))
    group = _GROUPS.get(key)
    if group is None:
        with _GROUPS_LOCK:
            group = _GROUPS.setdefault(key, GroupCommit())
    return group


def run_script(client: Any, lua: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
    """Run ``lua`` on ``client``, in a pipeline with other threads' calls if they overlap."""
    return group_of(client).run(client, lua, keys, args)


def _settings(client: Any) -> Any:
    """What makes two clients interchangeable: their pool's connection class and plain
    connection settings (host, port, db, credentials, decoding; not per-pool helper
    objects). A client without a pool, a test double say, is its own."""
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if not isinstance(kwargs, dict):
        return id(client)
    plain = (str, bytes, int, float, bool, type(None))
    return (getattr(pool, "connection_class", None),
            frozenset((k, v) for k, v in kwargs.items() if isinstance(v, plain)))


def _sha(lua: str) -> str:
    sha = _SHAS.get(lua)
    if sha is None:
        sha = _SHAS[lua] = hashlib.sha1(lua.encode()).hexdigest()
    return sha


def _no_script(reply: Any) -> bool:
    """Whether ``reply`` is Redis's NOSCRIPT error (by name: redis is not imported here)."""
    return isinstance(reply, Exception) and (
        type(reply).__name__ == "NoScriptError" or str(reply).startswith("NOSCRIPT"))
