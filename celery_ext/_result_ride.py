"""An attempt's last record save, sent in the same ``MULTI`` as Celery's own result write.

On the Redis result backend Celery writes every outcome (SUCCESS, RETRY, FAILURE)
as ``MULTI SETEX PUBLISH EXEC`` (``RedisBackend._set``) before the message is acked.
The attempt's last record save (its outcome and the lease release) *rides* in that
transaction: no round trip of its own (docs/cost.md), and a reader never sees the
result without the record. When the result is not written (``ignore_result``, a
result already stored, the transaction retried by ``ensure``) the ``task_postrun``
signal, which the tracer sends in the same thread before the ack, saves it the usual
way. ``RedisBackend`` subclasses that override ``_set`` never ride.
"""

from __future__ import annotations

import inspect
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from celery.signals import task_postrun

from ojs_adapters.runtime.group_commit import script_sha

#: The rider of the attempt running in this thread (a registry of one per thread).
_LOCAL = threading.local()
#: ``RedisBackend._set`` as Celery defines it, once replaced (``_install``).
_ORIGINAL: list[Callable[..., Any]] = []
_INSTALL_LOCK = threading.Lock()


class Rider:
    """A record save waiting for the result write of ``key``; ``save`` is the way alone."""

    __slots__ = ("args", "armed", "key", "keys", "lua", "save", "written")

    def __init__(self, key: bytes | str, lua: str, keys: Sequence[Any], args: Sequence[Any],
                 save: Callable[[], None]) -> None:
        self.key, self.lua, self.keys, self.args, self.save = key, lua, keys, args, save
        self.armed = True  # the next result write of ``key`` in this thread carries it
        self.written = False


def attach(backend: Any, task_id: str, lua: str, keys: Sequence[Any], args: Sequence[Any],
           save: Callable[[], None]) -> bool:
    """Let the save ride on ``task_id``'s next result write; ``False``: save it now."""
    if not _install(backend):
        return False
    _LOCAL.rider = Rider(backend.get_key_for_task(task_id), lua, keys, args, save)
    return True


def finish() -> None:
    """Save the rider of this thread the usual way unless its result write carried it."""
    rider: Rider | None = getattr(_LOCAL, "rider", None)
    _LOCAL.rider = None
    if rider is not None and not rider.written:
        rider.save()


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
                redis_backend._set = _set_riding
    return redis_backend._set is _set_riding and type(backend)._set is _set_riding


def _set_riding(self: Any, key: Any, value: Any, expires: Any = None) -> None:
    """``RedisBackend._set`` with this thread's rider in the transaction, if it waits for
    ``key``; Celery's own commands' errors raise as they would, the rider's are noted."""
    rider: Rider | None = getattr(_LOCAL, "rider", None)
    if rider is None or not rider.armed or rider.key != key:
        _ORIGINAL[0](self, key, value, expires)
        return
    rider.armed = False  # one try: a write ``ensure`` repeats goes alone (then ``finish``)
    if expires is None:
        expires = self.expires
    with self.client.pipeline() as pipe:
        if expires:
            pipe.setex(key, expires, value)
        else:
            pipe.set(key, value)
        pipe.publish(key, value)
        pipe.evalsha(script_sha(rider.lua), len(rider.keys), *rider.keys, *rider.args)
        replies = pipe.execute(raise_on_error=False)
    for reply in replies[:-1]:
        if isinstance(reply, Exception):
            raise reply
    rider.written = not isinstance(replies[-1], Exception)  # NOSCRIPT, say: ``finish`` saves
