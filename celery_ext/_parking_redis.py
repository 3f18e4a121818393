"""Parking on Redis: the parked set (``ojs_adapters.runtime.parked_set``) in Celery's format.

The envelope kombu's ``_put`` would push (built by the channel's own
``_inplace_augment_message``: delivery tag, delivery info, body encoding) goes
into the sorted set ``_ojs.parked`` (under the transport's ``global_keyprefix``),
scored by its exact due time, with the list key ``_put`` would use (priority
suffix included): a member is ``<byte length of the list key>:<list key><payload>``.
Each worker's main process runs a ``Mover`` (the consumer bootstep
``_parking.ParkingMover``) every ``ojs_park_poll_interval`` s (default 0.5); its push
step ``LPUSH``es the payload onto the list, as ``_put`` does. With no worker running,
parked retries wait in the set.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from kombu.utils.json import dumps

from celery_ext._parking_channel import _Park
from ojs_adapters.runtime import parked_set
from ojs_adapters.runtime.parked_set import BATCH, PARKED_KEY, PushStep

__all__ = ["BATCH", "DEFAULT_POLL", "PARKED_KEY", "POLL_SETTING", "Mover"]

logger = logging.getLogger("celery_ext")

#: App setting: seconds between two moves of due Redis entries.
POLL_SETTING = "ojs_park_poll_interval"
DEFAULT_POLL = parked_set.POLL_SECONDS

#: Splits ``member`` into its list key and payload and pushes the payload, as ``_put``.
_PUSH = PushStep("""
  local colon = string.find(member, ':', 1, true)
  local size = tonumber(string.sub(member, 1, colon - 1))
  redis.call('LPUSH', string.sub(member, colon + 1, colon + size),
             string.sub(member, colon + size + 1))
""")


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
            parked_set.add(client, PARKED_KEY, member, self.not_before)


class Mover(parked_set.Mover):
    """The parked set's ``Mover`` on ``app``'s broker, through the channel's own client
    (kombu's ``global_keyprefix`` applies to the set's key too)."""

    def __init__(self, app: Any, interval: float | None = None) -> None:
        self.app = app
        self._connection: Any = None
        super().__init__(PARKED_KEY, _PUSH, self._open, disconnect=self._close, logger=logger,
                         interval=float(interval if interval is not None else
                                        app.conf.get(POLL_SETTING) or DEFAULT_POLL))

    def _open(self) -> Any:
        self._connection = self.app.connection_for_write()
        with self._connection.default_channel.conn_or_acquire() as client:
            return client

    def _close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()
