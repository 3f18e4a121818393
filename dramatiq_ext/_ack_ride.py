"""An attempt's final record, saved in the same ``MULTI`` as Dramatiq's ack (``RedisBroker``).

The outcome of an attempt must be stored before its message is acked (a redelivery must
know the attempt ended). When the records live in the broker's Redis, the save goes in
one transaction with the ack, before it: ``AckGate.save_before_ack`` leaves the record on
the message (``stash``), ``before_ack`` arms it for this thread (``arm``), and the broker's
``dispatch`` script, wrapped once per broker (``_Dispatch``), sends the save and the ack
together when the consumer acks that message. Any other call of ``dispatch`` goes as it
came. A save Redis refuses inside the transaction (a wrong type at the key; with the
ack's own writes, an out-of-memory or read-only Redis refuses the ack too) is tried alone
right after the ack, logged if it fails: the record is an aid, the message held the truth.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from dramatiq.broker import Broker, MessageProxy

from dramatiq_ext._redis_retry import shares_redis
from ojs_adapters import JobRecord
from ojs_adapters.runtime import redis_wire
from ojs_adapters.runtime.backend_retry import count_failure
from ojs_adapters.runtime.handoff import ORDERED_SAVE_LUA

logger = logging.getLogger("dramatiq_ext")

#: Attribute of a ``MessageProxy`` holding the final record that waits for its ack.
STASH = "_ojs_ack_ride"
#: The armed ride of this thread (a registry of one per thread: the consumer's).
_LOCAL = threading.local()
_INSTALL_LOCK = threading.Lock()


class _Ride:
    """``record`` to save with the ``command`` (ack or nack) of Redis message ``redis_id``."""

    __slots__ = ("command", "message", "record", "redis_id", "store")

    def __init__(self, message: MessageProxy, store: Any, record: JobRecord,
                 command: str) -> None:
        self.message, self.store, self.record, self.command = message, store, record, command
        self.redis_id = message.options.get("redis_message_id")


def rides(broker: Broker, store: Any) -> bool:
    """Whether final records of ``broker``'s messages can ride on their acks."""
    return shares_redis(broker, store) and _install(broker)


def stash(message: MessageProxy, record: JobRecord) -> None:
    """Leave ``record`` on ``message``, to be saved with its ack."""
    vars(message)[STASH] = record


def arm(broker: Broker, message: MessageProxy, store: Any) -> None:
    """Called in ``before_ack``: the consumer's next ack (or nack) of ``message`` in this
    thread carries its stashed record, if it has one."""
    record: JobRecord | None = vars(message).get(STASH)
    _LOCAL.ride = None if record is None else _Ride(
        message, store, record, "nack" if message.failed else "ack")


class _Dispatch:
    """The broker's ``dispatch`` script, carrying this thread's armed ride on its ack."""

    def __init__(self, real: Any) -> None:
        self.real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def __call__(self, keys: Any = None, args: Any = None, client: Any = None) -> Any:
        ride: _Ride | None = getattr(_LOCAL, "ride", None)
        argv = list(args or [])
        if ride is None or client is not None or not argv or argv[0] != ride.command or \
                argv[-1] != ride.redis_id:
            return self.real(keys=keys, args=args, client=client)
        _LOCAL.ride = None
        return self._with_save(ride, list(keys or []), argv)

    def _with_save(self, ride: _Ride, keys: list[Any], argv: list[Any]) -> Any:
        store, data = ride.store, ride.record.to_dict()
        key, save_args = store.save_call(ride.record.id, data)
        # EVAL, not EVALSHA: a script Redis lost (a restart) must not let the ack go
        # without the save.
        save = ("EVAL", ORDERED_SAVE_LUA, 1, key, *save_args)
        ack = ("EVALSHA", self.real.sha, len(keys), *keys, *argv)
        saved, acked = redis_wire.transaction(store.client, [save, ack])
        if isinstance(acked, Exception):  # NOSCRIPT, say: the ack alone (it loads it)
            acked = self.real(keys=keys, args=argv)
        if isinstance(saved, Exception):  # the ack went: the record right after it
            try:
                store.save(ride.record.id, data)
            except Exception:  # the record is an aid: the message carried the truth
                count_failure("write job record", "failed")
                logger.warning("Could not save the job record of %r after its ack.",
                               ride.record.id, exc_info=True)
        vars(ride.message).pop(STASH, None)
        return acked


def _install(broker: Any) -> bool:
    """Wrap ``broker.scripts["dispatch"]`` (once); whether it is wrapped."""
    scripts = getattr(broker, "scripts", None)
    if not isinstance(scripts, dict) or not hasattr(scripts.get("dispatch"), "sha"):
        return False
    if not isinstance(scripts["dispatch"], _Dispatch):
        with _INSTALL_LOCK:
            if not isinstance(scripts["dispatch"], _Dispatch):
                scripts["dispatch"] = _Dispatch(scripts["dispatch"])
    return True
