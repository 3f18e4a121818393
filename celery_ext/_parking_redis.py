"""Parking on Redis: a sorted set of envelopes and the ``Mover`` that queues them when due.

The envelope kombu's ``_put`` would push (built by the channel's own
``_inplace_augment_message``: delivery tag, delivery info, body encoding) goes
into the sorted set ``_ojs.parked`` (under the transport's ``global_keyprefix``),
scored by its exact due time, with the list key ``_put`` would use (priority
suffix included). Each worker's main process runs a ``Mover`` (the consumer
bootstep ``_parking.ParkingMover``): every ``ojs_park_poll_interval`` s (default
0.5) one Lua script moves the entries due within ``LEAD`` s onto their lists
(``LPUSH``, as ``_put``) and removes them from the set, atomically: nothing lost,
nothing moved twice by two workers, as durable as the broker's Redis. With no
worker running, parked retries wait in the set.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping
from typing import Any

from kombu.utils.json import dumps

from celery_ext._parking_channel import _Park
from ojs_adapters.runtime._periodic import Periodic
from ojs_adapters.runtime.parking import LEAD

logger = logging.getLogger("celery_ext")

#: App setting: seconds between two moves of due Redis entries.
POLL_SETTING = "ojs_park_poll_interval"
DEFAULT_POLL = 0.5
#: The Redis sorted set of parked envelopes (kombu's client adds the ``global_keyprefix``).
PARKED_KEY = "_ojs.parked"
#: Most entries one script run moves.
BATCH = 500

#: Moves the due entries of KEYS[1] (score <= ARGV[1], at most ARGV[2]) to their lists.
#: A member is ``<byte length of the list key>:<list key><payload>``.
_MOVE_DUE_LUA = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, member in ipairs(due) do
  local colon = string.find(member, ':', 1, true)
  local size = tonumber(string.sub(member, 1, colon - 1))
  redis.call('LPUSH', string.sub(member, colon + 1, colon + size),
             string.sub(member, colon + size + 1))
  redis.call('ZREM', KEYS[1], member)
end
return #due
"""


class _RedisPark(_Park):
    """Add the envelope ``_put`` would push to the parked set, scored by its due time."""

    def publish(self, channel: Any, message: Any, exchange: str, routing_key: str,
                kwargs: Mapping[str, Any]) -> Any:
        channel._inplace_augment_message(message, exchange, routing_key)
        priority = channel._get_message_priority(message, reverse=False)
        target = channel.global_keyprefix + channel._q_for_pri(self.queue, priority)
        payload: str = dumps(message)  # type: ignore[no-untyped-call]  # as ``_put``
        member = f"{len(target.encode())}:{target}{payload}"
        with channel.conn_or_acquire() as client:
            client.zadd(PARKED_KEY, {member: self.not_before})


class Mover:
    """Moves due entries of the parked set to their Redis lists, from one daemon thread."""

    def __init__(self, app: Any, interval: float | None = None) -> None:
        self.app = app
        self.interval = float(interval if interval is not None else
                              app.conf.get(POLL_SETTING) or DEFAULT_POLL)
        self._runner = Periodic("ojs-park-mover", self._round, self.interval,
                                on_error=self._close, logger=logger)
        self._connection: Any = None
        self._script: Any = None
        self._client: Any = None

    def move_due(self, now: float | None = None) -> int:
        """Move every entry due by ``now + LEAD`` (default: the time now); how many moved."""
        client = self._redis()
        horizon = (time.time() if now is None else now) + max(LEAD, self.interval)
        moved = 0
        while True:
            count = int(self._script(keys=[PARKED_KEY], args=[repr(horizon), BATCH],
                                     client=client))
            moved += count
            if count < BATCH:
                return moved

    def start(self) -> None:
        """Start the thread (a no-op if it runs)."""
        self._runner.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread and close its connection."""
        self._runner.stop(timeout)
        self._close()

    def _redis(self) -> Any:
        if self._client is None:
            self._connection = self.app.connection_for_write()
            # the channel's own client: kombu's global_keyprefix, on the set key too
            with self._connection.default_channel.conn_or_acquire() as client:
                self._client = client
            self._script = client.register_script(_MOVE_DUE_LUA)
        return self._client

    def _close(self) -> None:
        connection, self._connection, self._client = self._connection, None, None
        if connection is not None:
            with contextlib.suppress(Exception):  # closing a broken connection
                connection.close()

    def _round(self) -> None:
        moved = self.move_due()  # an error: ``Periodic`` logs it and calls ``_close``
        if moved:
            logger.debug("ojs-adapters: moved %d parked retries to their queues", moved)
