"""RabbitMQ: an ack is sent only on the channel its message came from.

An AMQP ack names a message by its delivery tag, a number that counts the
deliveries of *one channel* from 1. When a Dramatiq consumer's connection drops,
the consumer thread opens a new one, and the messages it received before (still
in the work queue, or processing, or holding their ack while the adapter waits
for the broker: ``middleware``'s hand-off) are later acked through the *new*
consumer, by the same number. Dramatiq drops a tag the new consumer never issued
("not in known tags"), but one it did issue names another message: that message
is acked unprocessed and RabbitMQ deletes it (a dead-letter hop lost, or a job).

``guard_acks(broker)`` wraps the ``consume`` of a ``RabbitmqBroker``: each
consumer remembers the deliveries it received, and an ack or nack of any other
delivery is not sent. Nothing is lost by that: RabbitMQ gave every unacked
message of the closed channel back when it closed, and that second delivery is
judged from the job record (``ojs_adapters.runtime.handoff.judge_delivery``).
"""

from __future__ import annotations

import logging
from typing import Any

from dramatiq.broker import Broker, Consumer, MessageProxy

logger = logging.getLogger(__name__)

#: Attribute marking a broker whose ``consume`` is already wrapped.
_WRAPPED = "_ojs_guards_acks"
#: Attribute of a ``MessageProxy`` naming the consumer that received it.
_RECEIVED_BY = "_ojs_received_by"


def guard_acks(broker: Broker) -> bool:
    """Wrap ``broker.consume`` (a ``RabbitmqBroker``'s, once) as the module docstring says.

    Returns whether ``broker`` is a RabbitMQ broker (wrapped now or before).
    """
    try:
        from dramatiq.brokers.rabbitmq import RabbitmqBroker
    except ImportError:  # dramatiq without its rabbitmq extra
        return False
    if not isinstance(broker, RabbitmqBroker):
        return False
    if getattr(broker, _WRAPPED, False):
        return True
    consume = broker.consume

    def guarded_consume(queue_name: str, prefetch: int = 1, timeout: int = 5000) -> Consumer:
        return _ChannelBound(consume(queue_name, prefetch=prefetch, timeout=timeout))

    broker.consume = guarded_consume  # type: ignore[method-assign]
    setattr(broker, _WRAPPED, True)
    return True


class _ChannelBound(Consumer):
    """A consumer that acks and nacks only the deliveries it received itself."""

    def __init__(self, inner: Consumer) -> None:
        self.inner = inner

    def __next__(self) -> MessageProxy | None:
        message = next(self.inner)
        if message is not None:
            vars(message)[_RECEIVED_BY] = self.inner
        return message

    def ack(self, message: MessageProxy) -> None:
        if self._received(message, "ack"):
            self.inner.ack(message)

    def nack(self, message: MessageProxy) -> None:
        if self._received(message, "nack"):
            self.inner.nack(message)

    def requeue(self, messages: Any) -> None:
        self.inner.requeue(messages)

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _received(self, message: MessageProxy, what: str) -> bool:
        if vars(message).get(_RECEIVED_BY, self.inner) is self.inner:
            return True
        logger.info("Not sending the %s of message %r: it came on a connection that has "
                    "closed since, and RabbitMQ delivers it again.", what, message.message_id)
        return False
