"""Parking: a long retry waits on the broker, not in a worker (RET-11, ojs-retry.md 9.1).

A native Celery retry is an ETA message that a worker holds unacked until it is due:
worker memory per waiting retry, a channel closed by RabbitMQ's ``consumer_timeout``. So
a retry due in more than ``ojs_park_after`` seconds (60; ``None``: never) waits on the
broker as the same message and comes back to the queue its attempt was consumed from
about a second before it is due (``_attempt.wait_for_countdown`` still guards the rest).
This module decides whether to park and wires the worker; the retry waits in
``_parking_rabbitmq`` (delay levels) or ``_parking_redis`` (the parked set). Anything else
publishes the native retry. Limits: docs/long-waits.md.
"""

from __future__ import annotations

import time
from typing import Any

from celery import bootsteps

from celery_ext._conf import setting
from celery_ext._parking_channel import _Park, _ParkingChannel
from celery_ext._parking_rabbitmq import (
    _TOPOLOGY,
    DEFAULT_PREFIX,
    MAX_PARK,
    PREFIX_SETTING,
    RETRY_DECLARE,
    _AmqpPark,
    delivery_exchange,
    prefix_of,
    restore_delivery_info,
)
from celery_ext._parking_redis import (
    BATCH,
    DEFAULT_POLL,
    PARKED_KEY,
    POLL_SETTING,
    Mover,
    _RedisPark,
)
from ojs_adapters.errors import OjsValidationError
from ojs_adapters.runtime.delay_levels import routable
from ojs_adapters.runtime.parking import DEFAULT_PARK_AFTER, park_threshold

__all__ = [
    "BATCH",
    "DEFAULT_POLL",
    "DEFAULT_PREFIX",
    "MAX_PARK",
    "PARKED_KEY",
    "PARK_SETTING",
    "POLL_SETTING",
    "PREFIX_SETTING",
    "RETRY_DECLARE",
    "Mover",
    "ParkingMover",
    "delivery_exchange",
    "install",
    "park_after",
    "parking_producer",
    "prefix_of",
    "restore_delivery_info",
    "wants_park",
]

#: App setting: park retries left to wait more than this many seconds (``None``: never).
PARK_SETTING = "ojs_park_after"


def park_after(app: Any) -> float | None:
    """The app's parking threshold in seconds (at least 1), or ``None`` if parking is off.

    An invalid setting falls back to the default (the worker-start check reports it):
    the retry being handed off is no place to fail.
    """
    try:
        return park_threshold(setting(app, PARK_SETTING, DEFAULT_PARK_AFTER), field=PARK_SETTING)
    except OjsValidationError:
        return DEFAULT_PARK_AFTER


def wants_park(app: Any, not_before: float) -> bool:
    """Whether a retry due at ``not_before`` waits longer than ``app``'s parking threshold."""
    threshold = park_after(app)
    return threshold is not None and not_before - time.time() > threshold


def parking_producer(app: Any, conn: Any, *, queue: str, not_before: float) -> Any | None:
    """A producer of ``conn`` whose publish parks the message until ``not_before``.

    ``None`` when the native publish applies: parking is off, the countdown is
    not over the threshold, ``queue`` is not in the app's queue table (``queue_of``
    fell back on a routing key), the transport cannot park, or the RabbitMQ levels
    are unavailable (logged).
    """
    if not wants_park(app, not_before):
        return None
    if queue not in app.amqp.queues:  # not a queue this worker knows: route it natively
        return None
    driver = conn.transport.driver_type
    channel = conn.default_channel
    park: _Park
    if driver == "redis":
        park = _RedisPark(queue, not_before)
    elif driver == "amqp" and routable(queue) and _TOPOLOGY.ensure(app, conn):
        park = _AmqpPark(queue, not_before, prefix_of(app), app)
    else:
        return None
    return conn.Producer(channel=_ParkingChannel(channel, park))


class ParkingMover(bootsteps.StartStopStep):  # type: ignore[misc]  # celery has no hints
    """Consumer bootstep: on a Redis broker, a ``Mover`` in the worker's main process."""

    label = "ojs park mover"

    def include_if(self, parent: Any) -> bool:
        try:
            with parent.app.connection_for_write() as conn:
                return bool(conn.transport.driver_type == "redis")
        except Exception:  # an unknown transport: nothing to move
            return False

    def create(self, parent: Any) -> Mover:
        return Mover(parent.app)  # StartStopStep starts and stops it

    def shutdown(self, parent: Any) -> None:
        if self.obj is not None:
            self.obj.stop()


def install(app: Any) -> None:
    """Add the ``ParkingMover`` step to ``app``'s workers (``OjsTask.on_bound`` calls it)."""
    app.steps["consumer"].add(ParkingMover)
