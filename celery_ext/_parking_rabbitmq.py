"""Parking on RabbitMQ: the delay levels a long retry waits in (RET-11, see ``_parking``).

The binary delay layout of kombu's native delayed delivery, under our own names
(``ojs_park_prefix``): 28 queues ``<prefix>_celery_delayed_<n>`` and the exchange
``<prefix>_celery_delayed_delivery``, declared once per process by the shared
``ojs_adapters.runtime.delay_levels``. A retry is published (confirmed, mandatory) to the
top level and routed back to ``<queue>`` by an exact binding, whatever the queue's
exchange type; ``restore_delivery_info`` makes it a delivery to that queue again.
Details: docs/long-waits.md.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping
from typing import Any

from celery_ext._parked_index import index_parked
from celery_ext._parking_channel import _Park
from ojs_adapters.runtime.delay_levels import (
    BITS,
    MAX_SECONDS,
    RETRY_DECLARE,
    TOP_LEVEL,
    Declared,
    DelayLevels,
    binding_key,
    declare,
)
from ojs_adapters.runtime.delay_levels import routing_key as delay_key

logger = logging.getLogger("celery_ext")

#: App setting: name prefix of the RabbitMQ delay levels and delivery exchange.
PREFIX_SETTING = "ojs_park_prefix"
DEFAULT_PREFIX = "ojs"
#: Longest park on RabbitMQ (28 bits of seconds); a longer countdown waits the rest natively.
MAX_PARK = MAX_SECONDS
#: A delay-level routing key: 28 bits, then the destination.
_BITS = re.compile(rf"^(?:[01]\.){{{BITS}}}")

__all__ = ["DEFAULT_PREFIX", "MAX_PARK", "PREFIX_SETTING", "RETRY_DECLARE", "delivery_exchange",
           "levels_of", "prefix_of", "restore_delivery_info"]


def prefix_of(app: Any) -> str:
    """The name prefix of the app's RabbitMQ delay levels."""
    return str(app.conf.get(PREFIX_SETTING) or DEFAULT_PREFIX)


def levels_of(prefix: str) -> DelayLevels:
    """The delay levels of ``prefix``: ``<prefix>_celery_delayed_<n>``, as kombu names them."""
    return DelayLevels(f"{prefix}_celery_delayed")


def delivery_exchange(prefix: str) -> str:
    """The topic exchange the last delay level dead-letters to."""
    return levels_of(prefix).delivery


def restore_delivery_info(message: Any, app: Any) -> None:
    """Make a retry that came back from the RabbitMQ delay levels an anonymous delivery to
    its queue (as Celery's own retries are), in place; anything else is left alone."""
    info = getattr(message, "delivery_info", None)
    if not isinstance(info, dict):
        return
    exchange, key = str(info.get("exchange") or ""), str(info.get("routing_key") or "")
    if not exchange or not exchange.startswith(f"{levels_of(prefix_of(app)).base}_"):
        return  # the default exchange (most deliveries): no settings read
    bits = _BITS.match(key)
    if bits is not None and key[bits.end():]:
        info["exchange"], info["routing_key"] = "", key[bits.end():]


class _AmqpPark(_Park):
    """Publish to the delay levels, for the whole seconds left, bound back to the queue."""

    def __init__(self, queue: str, not_before: float, prefix: str, app: Any) -> None:
        super().__init__(queue, not_before)
        self.prefix = prefix
        self.app = app

    def publish(self, channel: Any, message: Any, exchange: str, routing_key: str,
                kwargs: Mapping[str, Any]) -> Any:
        seconds = min(int(self.not_before - time.time()), MAX_PARK)
        if seconds < 1:  # due already: the native publish
            return channel.basic_publish(message, exchange=exchange, routing_key=routing_key,
                                         **kwargs)
        try:
            channel.queue_bind(queue=self.queue, exchange=delivery_exchange(self.prefix),
                               routing_key=binding_key(self.queue))
            # mandatory: a level deleted under us returns the message (an error) before
            # the confirm, instead of dropping it
            sent = channel.basic_publish(
                message, exchange=levels_of(self.prefix).level(TOP_LEVEL),
                routing_key=delay_key(seconds, self.queue),
                **{**kwargs, "mandatory": True})
        except Exception:
            _TOPOLOGY.forget(self.prefix)  # declared again on the next try (the hand-off's)
            raise
        index_parked(self.app, message, self.queue, self.not_before)  # the console lists it
        return sent


class _Topology:
    """The RabbitMQ delay levels, declared once per process (and prefix, and broker)."""

    def __init__(self) -> None:
        self._declared = Declared(RETRY_DECLARE)

    def ensure(self, app: Any, conn: Any) -> bool:
        """Declare the levels if this process has not; ``False`` if they are unavailable.

        A connection error is raised (the hand-off retries it); a channel error (the
        levels exist with other arguments, an old broker) is logged and parks nothing
        for ``RETRY_DECLARE`` s.
        """
        prefix = prefix_of(app)
        return self._declared.ensure((prefix, conn.as_uri()), lambda: _declare(app, prefix))

    def forget(self, prefix: str) -> None:
        """Declare the levels of ``prefix`` again on their next use."""
        self._declared.forget(lambda key: isinstance(key, tuple) and key[0] == prefix)


def _declare(app: Any, prefix: str) -> bool:
    """Declare the levels of ``prefix`` on a fresh connection, with the queue type Celery's
    ``broker_native_delayed_delivery_queue_type`` says (default ``quorum``)."""
    queue_type = str(app.conf.get("broker_native_delayed_delivery_queue_type") or "quorum")
    with app.connection_for_write() as fresh:
        try:
            declare(_KombuLevels(fresh.channel()), levels_of(prefix), queue_type=queue_type)
        except fresh.connection_errors:
            raise
        except Exception as error:
            logger.error("ojs-adapters: cannot declare the RabbitMQ delay levels "
                         "%s_celery_delayed_* (%s queues): %r; long retries wait "
                         "in the worker", prefix, queue_type, error)
            return False
    return True


class _KombuLevels:
    """A kombu channel as a ``delay_levels.LevelChannel``: the arguments kombu's entities
    pass (py-amqp's defaults differ: ``auto_delete=True``)."""

    def __init__(self, channel: Any) -> None:
        self.channel = channel

    def exchange_declare(self, *, exchange: str, exchange_type: str, durable: bool) -> object:
        return self.channel.exchange_declare(exchange=exchange, type=exchange_type,
                                             durable=durable, auto_delete=False)

    def queue_declare(self, *, queue: str, durable: bool, arguments: dict[str, object]) -> object:
        return self.channel.queue_declare(queue=queue, durable=durable, exclusive=False,
                                          auto_delete=False, arguments=arguments)

    def queue_bind(self, *, queue: str, exchange: str, routing_key: str) -> object:
        return self.channel.queue_bind(queue=queue, exchange=exchange, routing_key=routing_key)

    def exchange_bind(self, *, destination: str, source: str, routing_key: str) -> object:
        return self.channel.exchange_bind(destination=destination, source=source,
                                          routing_key=routing_key)


_TOPOLOGY = _Topology()
