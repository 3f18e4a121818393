"""A record save sent in the same ``MULTI`` as kombu's ``LPUSH`` of a successor, on Redis.

When the broker and the result backend are one Redis server and database, a retry's
``retryable`` record (already marked handed off) goes in the transaction that pushes the
retry, before it, and a dead letter's handed-off mark after the push: the record and the
successor appear together, and the save costs no round trip of its own (docs/cost.md).
Kombu's Redis ``Channel._put`` is routed through ``_put_riding`` once. A push it does not
recognise (another queue, a publish batch, an expiring queue) goes the native way, a
retry's record saved alone before it; ``finish`` says whether the save rode.
"""

from __future__ import annotations

import inspect
import sys
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from celery_ext._handoff import broker_driver
from ojs_adapters.runtime import redis_wire

#: The rider of the publish under way in this thread (a registry of one per thread).
_LOCAL = threading.local()
#: ``Channel._put`` as kombu defines it, once replaced (``_install``).
_ORIGINAL: list[Callable[..., Any]] = []
_INSTALL_LOCK = threading.Lock()
#: Registry of ``shares_server``'s answer per app.
_SHARED_REGISTRY: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
#: Connection settings that make two Redis clients one server and database.
_SAME = ("host", "port", "db", "path", "username", "password")


class PutRider:
    """A record save waiting for the next push to ``queue`` in this thread."""

    __slots__ = ("alone", "args", "armed", "client", "first", "keys", "lua", "queue",
                 "stray", "written")

    def __init__(self, client: Any, queue: str, lua: str, keys: Sequence[Any],
                 args: Sequence[Any], first: bool, alone: Callable[[], None] | None) -> None:
        self.client, self.queue, self.lua, self.keys, self.args = client, queue, lua, keys, args
        self.first = first  # the save before the push (a retry), else after (a mark)
        self.alone = alone  # a first save's record as it must be before a push it cannot ride
        self.armed = True
        self.written = False  # applied with the push
        self.stray = False  # applied without it: Redis refused the push inside EXEC


def attach(app: Any, client: Any, queue: str, lua: str, keys: Sequence[Any],
           args: Sequence[Any], *, first: bool, alone: Callable[[], None] | None = None) -> bool:
    """Let the script ``lua`` ride on this thread's next push to ``queue``; ``False`` (save
    alone) unless ``app``'s broker is kombu's Redis on the server and database of ``client``.
    ``alone``: how a ``first`` save is made before another push comes (unmarked: the
    successor is not on the broker yet)."""
    if not _install() or not shares_server(app, client):
        return False
    _LOCAL.rider = PutRider(client, queue, lua, keys, args, first, alone)
    return True


def shares_server(app: Any, client: Any) -> bool:
    """Whether ``app``'s broker is kombu's Redis transport on ``client``'s server and
    database (found once per app: both are the app's settings)."""
    known = _SHARED_REGISTRY.get(app)
    if known is None:
        module = sys.modules.get("kombu.transport.redis")
        try:
            # The transport's name needs no connection: AMQP is never asked for a channel
            # here, on a hand-off's path that the broker may just have cut.
            if module is None or broker_driver(app) != "redis":
                known = False
            else:
                with app.connection_for_write() as conn:
                    channel = conn.default_channel
                    known = isinstance(channel, module.Channel) and \
                        _same_server(channel, client)
        except Exception:  # out of reach: no ride this time (the save goes alone); ask again
            return False
        _SHARED_REGISTRY[app] = known
    return known


def finish() -> bool:
    """Disarm this thread's rider; whether its save went in with the push."""
    return settle()[0]


def settle() -> tuple[bool, bool]:
    """Disarm this thread's rider: whether its save went in with the push, and whether it
    went in without it (Redis refused the push inside the transaction)."""
    rider: PutRider | None = getattr(_LOCAL, "rider", None)
    _LOCAL.rider = None
    return (rider is not None and rider.written), (rider is not None and rider.stray)


def _install() -> bool:
    """Route kombu's ``Channel._put`` through ``_put_riding`` (once); whether it is."""
    module = sys.modules.get("kombu.transport.redis")
    channel = getattr(module, "Channel", None)
    if channel is None:
        return False
    if not _ORIGINAL:
        with _INSTALL_LOCK:
            if not _ORIGINAL:
                original = channel._put
                _ORIGINAL.append(original)
                if list(inspect.signature(original).parameters) != [
                        "self", "queue", "message", "kwargs"]:
                    return False  # a kombu we do not know: never ride
                channel._put = _put_riding
    return bool(channel._put is _put_riding)


def _put_riding(self: Any, queue: str, message: Any, **kwargs: Any) -> None:
    """kombu's ``_put``, with this thread's rider in a ``MULTI`` around the ``LPUSH`` when it
    waits for ``queue``; the push's error raises as it would. A save that must come first
    never follows a push: before any other push of this thread while it waits, it is saved
    alone."""
    rider: PutRider | None = getattr(_LOCAL, "rider", None)
    if rider is None or not rider.armed:
        _ORIGINAL[0](self, queue, message, **kwargs)
        return
    if rider.queue != queue or kwargs.get("_publish_batch") is not None or \
            (self._expires and queue in self._expires) or not _same_server(self, rider.client):
        if rider.first:
            _save_alone(rider)
        _ORIGINAL[0](self, queue, message, **kwargs)
        return
    from kombu.utils.json import dumps

    key = self.global_keyprefix + self._q_for_pri(
        queue, self._get_message_priority(message, reverse=False))
    # EVAL, not EVALSHA: a script Redis lost (a restart) must not split the pair.
    save = ("EVAL", rider.lua, len(rider.keys), *rider.keys, *rider.args)
    push = ("LPUSH", key, dumps(message))  # type: ignore[no-untyped-call]
    commands = [save, push] if rider.first else [push, save]
    replies = redis_wire.transaction(rider.client, commands)  # raises if nothing applied
    rider.armed = False  # a failed try keeps it armed: the next try rides again
    pushed, saved = (replies[1], replies[0]) if rider.first else (replies[0], replies[1])
    # A push refused inside EXEC (a queue key of another type) leaves the save applied
    # alone: not "written with the push", so the caller puts back the record as it must
    # be without a successor (``finish``).
    rider.written = not isinstance(saved, Exception) and not isinstance(pushed, Exception)
    rider.stray = not isinstance(saved, Exception) and isinstance(pushed, Exception)
    if isinstance(pushed, Exception):
        raise pushed


def _save_alone(rider: PutRider) -> None:
    """A retry's record, alone and unmarked (``alone``), now that a push it cannot ride comes
    first; the rider disarmed, not written (the save after the successor's push marks it)."""
    rider.armed = False
    if rider.alone is not None:
        rider.alone()


def _same_server(channel: Any, client: Any) -> bool:
    """Whether kombu's ``channel`` talks to the server and database of ``client``: the
    same address, named in both pools. A Sentinel pool names none (its master is found at
    connect time, and two services look alike): it never rides."""
    try:
        theirs, ours = channel.pool, client.connection_pool
        mine, other = theirs.connection_kwargs, ours.connection_kwargs
    except AttributeError:
        return False
    if getattr(theirs, "service_name", None) is not None or \
            getattr(ours, "service_name", None) is not None or \
            (mine.get("host") is None and mine.get("path") is None):
        return False
    return all(mine.get(name) == other.get(name) for name in _SAME)
