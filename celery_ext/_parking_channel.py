"""The publish hook parking goes through: a channel whose ``basic_publish`` parks.

``_parking.parking_producer`` wraps the producer's channel in ``_ParkingChannel``;
each broker's ``_Park`` (``_parking_rabbitmq``, ``_parking_redis``) says where the
message waits.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class _Park:
    """Where one message waits: ``publish`` replaces the channel's ``basic_publish``."""

    def __init__(self, queue: str, not_before: float) -> None:
        self.queue = queue
        self.not_before = not_before

    def publish(self, channel: Any, message: Any, exchange: str, routing_key: str,
                kwargs: Mapping[str, Any]) -> Any:
        raise NotImplementedError


class _ParkingChannel:
    """A kombu channel whose ``basic_publish`` parks; everything else is the channel's."""

    def __init__(self, channel: Any, park: _Park) -> None:
        self._channel = channel
        self._park = park

    def __getattr__(self, name: str) -> Any:
        return getattr(self._channel, name)

    def basic_publish(self, message: Any, exchange: str = "", routing_key: str = "",
                      **kwargs: Any) -> Any:
        return self._park.publish(self._channel, message, exchange, routing_key, kwargs)
