"""Publishing a message's successor (its retry, or its dead-letter hop) before the ack.

``OjsRetries`` decides in ``after_process_message`` and Dramatiq acks afterwards, so the
successor is published in between and must be accepted first: on RabbitMQ through a
confirming channel of our own per thread, with the ``x-ojs-*`` headers (Dramatiq's
``enqueue`` sets neither); elsewhere through ``broker.enqueue``. Every copy carries a
fresh token (option ``ojs_token``), so a duplicate is told from a redelivery; a delivery
given back unrun keeps its token (``keep_token``). Why: docs/lifecycle.md.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping
from typing import Any

from dramatiq.broker import Broker
from dramatiq.common import current_millis, dq_name, q_name
from dramatiq.message import Message

from dramatiq_ext._parked_index import index_parked
from dramatiq_ext._parking import Parking
from ojs_adapters.runtime.backend_retry import DEFAULT_BACKEND_RETRY, BackendRetry
from ojs_adapters.runtime.tokens import new_token

#: Message option holding the token of one published copy.
TOKEN_OPTION = "ojs_token"


class Publisher:
    """Publishes successors with in-place retries; one per ``OjsRetries``.

    >>> from dramatiq.brokers.stub import StubBroker
    >>> Publisher().retry.tries
    5
    """

    def __init__(self, retry: BackendRetry | None = None, parking: Parking | None = None) -> None:
        self.retry = retry or DEFAULT_BACKEND_RETRY
        self.parking = parking or Parking(park_after=None)
        self._local = threading.local()

    def publish(self, broker: Broker, message: Message[Any], *, delay: int | None,
                headers: Mapping[str, Any], operation: str, keep_token: bool = False) -> None:
        """Publish ``message`` (after ``delay`` ms) until accepted; ``OjsBackendError`` if not.

        Each try gets a fresh token: two tries that both land are told apart; unless
        ``keep_token`` (a delivery given back: the same copy again).
        """
        message = message.copy(options=dict(headers))

        def once() -> None:
            fresh = message if keep_token else message.copy(
                options={TOKEN_OPTION: new_token()})
            self.publish_once(broker, fresh, delay, headers)

        self.retry.call(once, operation=operation)

    def publish_once(self, broker: Broker, message: Message[Any], delay: int | None,
                     headers: Mapping[str, Any]) -> None:
        """One try: the broker's own ``enqueue``, or a confirmed AMQP publish with headers;
        a long retry is parked (``_parking``)."""
        if _is_rabbitmq(broker):
            self._publish_amqp(broker, message, delay, headers)
        elif delay is not None and self.parking.wants(delay) and is_redis(broker):
            self.parking.park_redis(broker, message, delay)
        else:
            broker.enqueue(message, delay=delay)

    def _publish_amqp(self, broker: Any, message: Message[Any], delay: int | None,
                      headers: Mapping[str, Any]) -> None:
        import pika

        queue = q_name(message.queue_name)
        if delay is not None:
            message = message.copy(queue_name=dq_name(queue),
                                   options={"eta": current_millis() + delay})
        broker.declare_queue(queue, ensure=True)
        broker.emit_before("enqueue", message, delay)
        channel = self._channel(broker)
        properties = pika.BasicProperties(
            delivery_mode=2, priority=message.options.get("broker_priority"),
            headers={k: v for k, v in headers.items() if v is not None})
        exchange, routing_key = "", message.queue_name
        try:
            if delay is not None and self.parking.wants(delay):
                parked = self.parking.amqp_route(broker, channel, message.queue_name, delay)
                if parked is not None:
                    exchange, routing_key = parked
            # Blocks for the confirm; raises on nack, on a return (mandatory) and on a lost link.
            channel.basic_publish(exchange=exchange, routing_key=routing_key,
                                  body=message.encode(), properties=properties, mandatory=True)
        except Exception:
            self._drop_channel()
            if exchange:
                self.parking.forget_levels()  # declared again on the next try
            raise
        if exchange:  # parked: AMQP cannot list the levels, so the console keeps an index
            index_parked(broker, message)
        broker.emit_after("enqueue", message, delay)

    def _channel(self, broker: Any) -> Any:
        """This thread's confirming channel to ``broker`` (opened on first use)."""
        import pika

        channel = getattr(self._local, "channel", None)
        if channel is not None and channel.is_open and getattr(self._local, "broker", None) \
                is broker:
            return channel
        self._drop_channel()
        connection = pika.BlockingConnection(parameters=broker.parameters)
        channel = connection.channel()
        channel.confirm_delivery()
        self._local.connection, self._local.channel, self._local.broker = (
            connection, channel, broker)
        return channel

    def _drop_channel(self) -> None:
        connection = getattr(self._local, "connection", None)
        self._local.connection = self._local.channel = self._local.broker = None
        if connection is not None and connection.is_open:
            with contextlib.suppress(Exception):  # already broken: nothing to close cleanly
                connection.close()

    def close(self) -> None:
        """Close this thread's channel (other threads' close with their connections)."""
        self._drop_channel()


def is_redis(broker: Broker) -> bool:
    """Whether ``broker`` is Dramatiq's ``RedisBroker`` (``False`` without its extra)."""
    try:
        from dramatiq.brokers.redis import RedisBroker
    except ImportError:  # dramatiq without its redis extra
        return False
    return isinstance(broker, RedisBroker)


def _is_rabbitmq(broker: Broker) -> bool:
    try:
        from dramatiq.brokers.rabbitmq import RabbitmqBroker
    except ImportError:  # dramatiq without its rabbitmq extra
        return False
    return isinstance(broker, RabbitmqBroker)


