"""An attempt's last record save, sent in the same ``MULTI`` as Celery's own result write;
and the read before that write, answered from admission.

On the Redis result backend Celery writes every outcome (SUCCESS, RETRY, FAILURE)
as ``MULTI SETEX PUBLISH EXEC`` (``RedisBackend._set``) before the message is acked.
The attempt's last record save (its outcome and the lease release) *rides* in that
transaction: no round trip of its own (docs/cost.md), and a reader never sees the
result without the record. When the result is not written (``ignore_result``, a
result already stored, the transaction retried by ``ensure``) the ``task_postrun``
signal, which the tracer sends in the same thread before the ack, saves it the usual
way. ``RedisBackend`` subclasses that override ``_set`` never ride.

Before it stores an outcome Celery reads the task's result meta (``GET``), so as never to
overwrite a SUCCESS. Admission read that key in its own script (``peek``), and the store
takes that value instead of a round trip (``arm_peek``); its write then checks for a
SUCCESS in the same script (``GUARDED_SET_LUA``): Celery's rule, without its separate
read, and checked where it writes, so another writer meanwhile (a retry's successor that
finished first, a delivery whose lease lapsed) is never overwritten. Any other read of the
key during the attempt spoils the peek (Redis answers from then on), and a backend whose
metas Lua cannot read (not JSON, compressed, its own ``set``) keeps Celery's read.
"""

from __future__ import annotations

import datetime
import inspect
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from celery.signals import task_postrun

from ojs_adapters.runtime import redis_wire

#: The rider of the attempt running in this thread (a registry of one per thread).
_LOCAL = threading.local()
#: ``RedisBackend._set`` as Celery defines it, once replaced (``_install``).
_ORIGINAL: list[Callable[..., Any]] = []
#: ``RedisBackend.get`` as Celery defines it, once replaced (``_install``).
_ORIGINAL_GET: list[Callable[..., Any]] = []
_INSTALL_LOCK = threading.Lock()

#: Celery's write of a result meta (``SETEX``/``SET`` and ``PUBLISH``), unless the stored
#: meta is a SUCCESS (0); -1: a stored meta Lua cannot read as Celery's (Python decides).
#: Celery writes ``status`` first, so a prefix answers without decoding a large result.
#: KEYS[1] the meta key; ARGV[1] the value; ARGV[2] seconds to live ("": no expiry).
GUARDED_SET_LUA = """
local cur = redis.call('GET', KEYS[1])
if cur then
  local status = string.match(cur, '^{"status": "([%w_]+)",')
  if not status then
    local ok, meta = pcall(cjson.decode, cur)
    if not ok or type(meta) ~= 'table' or type(meta['status']) ~= 'string' then
      return -1
    end
    status = meta['status']
  end
  if status == 'SUCCESS' then return 0 end
end
if ARGV[2] == '' then redis.call('SET', KEYS[1], ARGV[1])
else redis.call('SETEX', KEYS[1], ARGV[2], ARGV[1]) end
redis.call('PUBLISH', KEYS[1], ARGV[1])
return 1
"""


class Rider:
    """A record save waiting for the result write of ``key``; ``save`` is the way alone;
    ``after`` runs once, when the save is done either way."""

    __slots__ = ("after", "args", "armed", "key", "keys", "lua", "save", "written")

    def __init__(self, key: bytes | str, lua: str, keys: Sequence[Any], args: Sequence[Any],
                 save: Callable[[], None], after: Callable[[], None] | None) -> None:
        self.key, self.lua, self.keys, self.args, self.save = key, lua, keys, args, save
        self.after = after
        self.armed = True  # the next result write of ``key`` in this thread carries it
        self.written = False

    def gone(self) -> None:
        """The save is done (or given up): ``after`` runs (once)."""
        after, self.after = self.after, None
        if after is not None:
            after()


class Peek:
    """The result meta ``key`` held as admission read it (``value``), for one later read."""

    __slots__ = ("armed", "key", "spoiled", "value")

    def __init__(self, key: Any, value: Any) -> None:
        self.key, self.value = key, value
        self.armed = False  # the next read of ``key`` in this thread takes ``value``
        self.spoiled = False  # ``key`` was read meanwhile: Redis answers from now on


def meta_key(backend: Any, task_id: str) -> Any | None:
    """The result meta key of ``task_id`` when ``backend`` can answer from a peek, else
    ``None`` (not the Redis backend, or one whose ``get`` is its own)."""
    if not _install(backend) or type(backend).get is not _get_peeking:
        return None
    return backend.get_key_for_task(task_id)


def peek(key: Any, value: Any) -> None:
    """What admission read at ``key`` (``meta_key``), kept for this thread's attempt."""
    _LOCAL.peek = Peek(key, value)


def arm_peek() -> None:
    """The next read of the attempt's meta (Celery's, before it stores the outcome) takes
    the peeked value, and the store's write checks the meta is not a SUCCESS in its own
    script."""
    kept: Peek | None = getattr(_LOCAL, "peek", None)
    if kept is not None and not kept.spoiled:
        kept.armed = True


def attach(backend: Any, task_id: str, lua: str, keys: Sequence[Any], args: Sequence[Any],
           save: Callable[[], None], after: Callable[[], None] | None = None) -> bool:
    """Let the save ride on ``task_id``'s next result write (``after`` runs once it is
    done, with that write or alone); ``False``: save it now."""
    if not _install(backend):
        return False
    _LOCAL.rider = Rider(backend.get_key_for_task(task_id), lua, keys, args, save, after)
    return True


def finish() -> None:
    """Save the rider of this thread the usual way unless its result write carried it."""
    rider: Rider | None = getattr(_LOCAL, "rider", None)
    _LOCAL.rider = None
    _LOCAL.peek = None
    _LOCAL.guard = None
    if rider is not None and not rider.written:
        try:
            rider.save()
        finally:
            rider.gone()


def _after_trace(**_: Any) -> None:
    finish()


task_postrun.connect(_after_trace, weak=False)


def _install(backend: Any) -> bool:
    """Route ``RedisBackend._set`` through ``_set_riding`` (once); whether ``backend`` rides."""
    module = sys.modules.get("celery.backends.redis")
    if module is None or not isinstance(backend, module.RedisBackend):
        return False
    redis_backend = module.RedisBackend
    if not _ORIGINAL:
        with _INSTALL_LOCK:
            if not _ORIGINAL:
                original = redis_backend._set
                if list(inspect.signature(original).parameters) != [
                        "self", "key", "value", "expires"]:
                    _ORIGINAL.append(original)  # a Celery we do not know: never ride
                    return False
                _ORIGINAL.append(original)
                _ORIGINAL_GET.append(redis_backend.get)
                redis_backend._set = _set_riding
                redis_backend.get = _get_peeking
    return redis_backend._set is _set_riding and type(backend)._set is _set_riding


def _get_peeking(self: Any, key: Any) -> Any:
    """``RedisBackend.get``, answered by this thread's armed peek of ``key`` (once)."""
    kept: Peek | None = getattr(_LOCAL, "peek", None)
    if kept is not None and kept.key == key:
        _LOCAL.peek = None if kept.armed else kept
        if kept.armed and _lua_reads(self):
            _LOCAL.guard = key  # the write that follows checks in its script
            return kept.value
        kept.spoiled = True
    return _ORIGINAL_GET[0](self, key)


def _lua_reads(backend: Any) -> bool:
    """Whether a store of ``backend`` can be checked in ``GUARDED_SET_LUA``: metas in
    JSON as is, written by ``RedisBackend``'s own ``set`` (through ``_set_riding``)."""
    redis_backend = sys.modules["celery.backends.redis"].RedisBackend
    kind = type(backend)
    return getattr(backend, "serializer", None) == "json" and \
        not getattr(backend, "compression", None) and kind.set is redis_backend.set and \
        kind._set_with_state is redis_backend._set_with_state


def _set_riding(self: Any, key: Any, value: Any, expires: Any = None) -> None:
    """``RedisBackend._set`` with this thread's rider in the transaction, if it waits for
    ``key``, and (a store that took the peek) written by ``GUARDED_SET_LUA``; Celery's own
    commands' errors raise as they would, the rider's are noted."""
    rider: Rider | None = getattr(_LOCAL, "rider", None)
    # Kept until a try returns: each write ``ensure`` repeats after a lost connection
    # checks again (the successor may have finished meanwhile).
    guarded = getattr(_LOCAL, "guard", None) == key
    if rider is not None and (not rider.armed or rider.key != key):
        rider = None  # it waits for another write
    if rider is None and not guarded:
        _ORIGINAL[0](self, key, value, expires)
        return
    if rider is not None:
        rider.armed = False  # one try: a write ``ensure`` repeats goes alone (``finish``)
    if expires is None:
        expires = self.expires
    seconds = int(expires.total_seconds()) if isinstance(expires, datetime.timedelta) \
        else expires  # as redis-py's ``setex`` reads it
    commands: list[tuple[Any, ...]] = [
        ("EVAL", GUARDED_SET_LUA, 1, key, value, seconds if expires else "")] if guarded \
        else [("SETEX", key, seconds, value) if expires else ("SET", key, value),
              ("PUBLISH", key, value)]
    if rider is not None:
        # EVAL, not EVALSHA: a script Redis lost (a restart, SCRIPT FLUSH) must not let the
        # result be seen before the record, as the other rides (_publish_ride, Dramatiq's).
        commands.append(("EVAL", rider.lua, len(rider.keys), *rider.keys, *rider.args))
    replies = redis_wire.transaction(self.client, commands)
    own = replies if rider is None else replies[:-1]
    for reply in own:
        if isinstance(reply, Exception):
            raise reply
    if rider is not None:
        rider.written = not isinstance(replies[-1], Exception)  # else ``finish`` saves
        if rider.written:
            rider.gone()
    if guarded and own[0] == -1:  # a meta Lua cannot read: Celery's read and rule decide
        stored = _ORIGINAL_GET[0](self, key)
        if not stored or self.decode_result(stored)["status"] != "SUCCESS":
            _ORIGINAL[0](self, key, value, expires)
    _LOCAL.guard = None  # the write is done (a repeat of a failed one checks again)
