"""Parking: a long retry waits on the broker, not in a worker (RET-11, ojs-retry.md 9.1).

A native Celery retry is an ETA message that a worker prefetches and holds,
unacked, until it is due: the worker's memory grows with every waiting retry
(about 17 KiB each), RabbitMQ closes the channel of a delivery held longer than
``consumer_timeout`` (30 min by default), and on Redis only the visibility
heartbeat keeps it from being handed out twice. So a retry that would wait
more than ``ojs_park_after`` seconds when it is published (app setting,
default 60; ``None`` turns parking off) is *parked*: the same message (body,
headers, ETA, ``not_before``, priority) goes to a place on the broker where
no consumer sees it until it is due, and then back to the queue its attempt
was consumed from. The decision and the record keep the exact float
countdown; parking only changes where the message waits. The worker then
holds it for about a second (the rest of its ETA), and
``_attempt.wait_for_countdown`` still guards "never before the delay" (RET-11).

This module decides whether to park and wires the worker; where a message waits:

- **RabbitMQ** (``_parking_rabbitmq``): the delay levels of kombu's native delayed
  delivery, under our own names, routed back to the queue by a binding, declared by
  the shared ``ojs_adapters.runtime.delay_levels``.
- **Redis** (``_parking_redis``): the shared parked set (``runtime.parked_set``), a
  sorted set scored by due time, moved onto the queue's list by a ``Mover`` in each
  worker's main process (``ParkingMover``).

Anything else publishes the native retry as before: ``memory://``, a wait not
over the threshold, a queue missing from the app's queue table or unfit for a
routing key, or RabbitMQ levels that cannot be declared (other arguments, a
broker older than 3.10 without quorum-queue TTLs: logged, tried again after a
minute). A parked retry comes back to the queue its attempt came from, not
through the original exchange (a topic or fanout exchange is not applied
again), and it queues like a new job: a backlog on that queue delays it. A
level deleted while retries wait in it loses them (a park into a deleted level
is an error, retried after declaring the levels again); a queue deleted and
declared again loses its binding until the next park to it.
"""

from __future__ import annotations

import time
from typing import Any

from celery import bootsteps

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
]

#: App setting: park retries left to wait more than this many seconds (``None``: never).
PARK_SETTING = "ojs_park_after"


def park_after(app: Any) -> float | None:
    """The app's parking threshold in seconds (at least 1), or ``None`` if parking is off.

    An invalid setting falls back to the default (the worker-start check reports it):
    the retry being handed off is no place to fail.
    """
    try:
        return park_threshold(app.conf.get(PARK_SETTING, DEFAULT_PARK_AFTER), field=PARK_SETTING)
    except OjsValidationError:
        return DEFAULT_PARK_AFTER


def parking_producer(app: Any, conn: Any, *, queue: str, not_before: float) -> Any | None:
    """A producer of ``conn`` whose publish parks the message until ``not_before``.

    ``None`` when the native publish applies: parking is off, the countdown is
    not over the threshold, ``queue`` is not in the app's queue table (``queue_of``
    fell back on a routing key), the transport cannot park, or the RabbitMQ levels
    are unavailable (logged).
    """
    threshold = park_after(app)
    if threshold is None or not_before - time.time() <= threshold:
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
