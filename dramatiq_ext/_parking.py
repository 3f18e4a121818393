"""Parking: a long Dramatiq retry waits on the broker, not in a worker (RET-11).

Dramatiq holds a delayed message unacked in a worker's memory until it is due, and on
RabbitMQ a delivery held past ``consumer_timeout`` closes its channel. So a retry due in
more than ``park_after`` seconds (60; ``None``: never) waits on the broker instead, as the
very message ``enqueue`` would put on ``<queue>.DQ``, and reaches ``<queue>.DQ`` less than
a second before it is due: on Redis in the parked set (``runtime.parked_set``, moved by a
``Mover`` in each worker process), on RabbitMQ in the delay levels
(``runtime.delay_levels``). Anything else leaves the retry to Dramatiq's own delay queue.
Details and limits: docs/long-waits.md.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
import weakref
from typing import Any

from dramatiq.common import current_millis, dq_name, q_name
from dramatiq.message import Message

from ojs_adapters.errors import OjsValidationError
from ojs_adapters.runtime import parked_set
from ojs_adapters.runtime.delay_levels import (
    MAX_SECONDS,
    RETRY_DECLARE,
    TOP_LEVEL,
    Declared,
    DelayLevels,
    binding_key,
    declare,
    routable,
    routing_key,
)
from ojs_adapters.runtime.parked_set import BATCH, PARKED_KEY, PushStep
from ojs_adapters.runtime.parking import DEFAULT_PARK_AFTER, park_threshold

__all__ = ["BATCH", "DEFAULT_PREFIX", "PARKED_KEY", "POLL_SECONDS", "RETRY_DECLARE", "Mover",
           "Parking", "parked_key"]

logger = logging.getLogger(__name__)

#: Default name prefix of the RabbitMQ delay levels.
DEFAULT_PREFIX = "ojs"
#: Seconds between two rounds of a ``Mover``.
POLL_SECONDS = parked_set.POLL_SECONDS

#: Puts ``member`` into its queue under namespace ARGV[3], as dispatch.lua's ``enqueue``.
_PUSH_LUA = """
  local entry = cjson.decode(member)
  local queue = ARGV[3] .. ':' .. entry[1]
  redis.call('HSET', queue .. '.msgs', entry[2], entry[3])
  redis.call('RPUSH', queue, entry[2])
"""


def parked_key(broker: Any) -> str:
    """The parked set of a ``RedisBroker``."""
    return parked_set.key_under(f"{broker.namespace}:")


class Parking:
    """Where an ``OjsRetries`` parks long retries; see the module docstring.

    >>> Parking(park_after=60).wants(60_001), Parking(park_after=60).wants(60_000)
    (True, False)
    >>> Parking(park_after=None).wants(10**9)
    False
    """

    def __init__(self, park_after: float | None = DEFAULT_PARK_AFTER,
                 prefix: str = DEFAULT_PREFIX) -> None:
        self.park_after = park_threshold(park_after, field="park_after")
        if not isinstance(prefix, str) or not prefix:
            raise OjsValidationError(f"park_prefix must be a non-empty string; got {prefix!r:.64}",
                                     code="INVALID_ARGS", details={
                                         "field": "park_prefix", "value": f"{prefix!r:.64}",
                                         "rule": "non-empty string"})
        self.levels = DelayLevels(f"{prefix}_dramatiq_delayed")
        self._lock = threading.Lock()
        self._declared = Declared(RETRY_DECLARE)
        self._movers: weakref.WeakKeyDictionary[Any, tuple[Mover, int]] = (
            weakref.WeakKeyDictionary())

    def wants(self, delay_ms: int | None) -> bool:
        """Whether a retry due in ``delay_ms`` milliseconds is parked."""
        return self.park_after is not None and delay_ms is not None and \
            delay_ms > self.park_after * 1000

    # -- Redis ------------------------------------------------------------------------

    def park_redis(self, broker: Any, message: Message[Any], delay: int) -> None:
        """Add to the parked set what ``RedisBroker.enqueue(message, delay=delay)`` would
        put on ``<queue>.DQ``; the ``enqueue`` hooks run as they would."""
        redis_id = str(uuid.uuid4())  # as ``enqueue``: one Redis id per copy
        eta = current_millis() + delay
        message = message.copy(queue_name=dq_name(q_name(message.queue_name)),
                               options={"redis_message_id": redis_id, "eta": eta})
        broker.emit_before("enqueue", message, delay)
        member = json.dumps([message.queue_name, redis_id, message.encode().decode()])
        parked_set.add(broker.client, parked_key(broker), member, eta / 1000)
        broker.emit_after("enqueue", message, delay)

    def start_mover(self, broker: Any) -> None:
        """Run a ``Mover`` for ``broker`` while at least one worker on it runs."""
        with self._lock:
            mover, users = self._movers.get(broker) or (Mover(broker), 0)
            self._movers[broker] = (mover, users + 1)
        mover.start()

    def stop_mover(self, broker: Any) -> None:
        """One worker on ``broker`` stopped: the last one stops its ``Mover``."""
        with self._lock:
            mover, users = self._movers.get(broker) or (None, 0)
            if mover is None:
                return
            if users > 1:
                self._movers[broker] = (mover, users - 1)
                return
            del self._movers[broker]
        mover.stop()

    # -- RabbitMQ ---------------------------------------------------------------------

    def amqp_route(self, broker: Any, channel: Any, queue_name: str,
                   delay: int) -> tuple[str, str] | None:
        """The exchange and routing key that park a message for ``queue_name`` (a ``.DQ``)
        for ``delay`` ms, after binding that queue to the delivery exchange; ``None``:
        publish it as Dramatiq would (not routable, or the levels are unavailable)."""
        seconds = min((delay - 1) // 1000, MAX_SECONDS)  # arrive < 1 s before the eta
        if seconds < 1 or not routable(queue_name) or not self._declare(broker, channel):
            return None
        channel.queue_bind(queue=queue_name, exchange=self.levels.delivery,
                           routing_key=binding_key(queue_name))
        return self.levels.level(TOP_LEVEL), routing_key(seconds, queue_name)

    def forget_levels(self) -> None:
        """Declare the levels again on their next use (after a failed park)."""
        self._declared.forget()

    def _declare(self, broker: Any, channel: Any) -> bool:
        """Declare the levels on ``channel``'s connection once per process and broker.

        A channel error (levels with other arguments, an old broker) is logged and
        parks nothing for ``RETRY_DECLARE`` s; a connection error is raised (the
        hand-off tries again).
        """
        import pika.exceptions

        def declare_on_side_channel() -> bool:
            side = channel.connection.channel()  # a failed declare closes its channel
            try:
                declare(side, self.levels)
            except pika.exceptions.ChannelClosed as error:
                logger.error("Cannot declare the RabbitMQ delay levels %s_*: %r; long retries "
                             "wait in the worker.", self.levels.base, error)
                return False
            finally:
                if side.is_open:
                    side.close()
            return True

        return self._declared.ensure(str(getattr(broker, "parameters", "")),
                                     declare_on_side_channel)


class Mover(parked_set.Mover):
    """The parked set's ``Mover`` for a ``RedisBroker``: due entries go to their ``.DQ``."""

    def __init__(self, broker: Any, interval: float = POLL_SECONDS) -> None:
        self.broker = broker
        super().__init__(parked_key(broker), PushStep(_PUSH_LUA, (broker.namespace,)),
                         lambda: broker.client, interval=interval,
                         name="ojs-dramatiq-park-mover", logger=logger)
