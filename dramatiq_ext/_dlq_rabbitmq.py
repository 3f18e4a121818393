"""Dead letters of a ``RabbitmqBroker``: the durable ``<queue>.XQ`` queues.

AMQP has no way to read a queue without taking its messages, so every operation
takes all of a ``.XQ`` queue's messages unacknowledged on a channel of its own,
acts on the ones it wants, and gives the rest back (``basic_nack`` with requeue;
RabbitMQ puts them back in place). Another reader of the same ``.XQ`` at that
moment sees it empty. A replay publishes the copies and acks their dead
deliveries inside one AMQP transaction; a client stopped before ``tx.commit``
changes nothing (the channel closes, the deliveries return). A dead message's
key is its message id plus a digest of its body.

AMQP cannot list queues either. The ``.XQ`` queues looked at are those of the
broker's declared queues and of the names given; with ``discover``, also every
``.XQ`` the management API lists or, when it does not answer, ``default.XQ`` if
it exists (the queue of an actor declared without ``queue_name``). ``coverage()``
says which it was.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any, NamedTuple

import pika
from dramatiq.common import xq_name
from dramatiq.message import Message
from pika.exceptions import ChannelClosedByBroker

from dramatiq_ext._dlq_common import (
    JobRecords,
    dead_letter_of,
    decoded,
    replay_message,
    undecodable_letter,
)
from dramatiq_ext._quiet_404 import NOT_FOUND, NotFoundQuiet
from ojs_adapters.runtime.dlq import (
    MANAGEMENT_OFF,
    AmqpAddress,
    Coverage,
    DeadLetter,
    QueueListing,
    ReplayMark,
    list_queues,
    originals,
)

#: Seconds without a delivery after which a read of a dead-letter queue stops.
_IDLE = 1.0
#: The queue of an actor declared without ``queue_name``: looked in when nothing lists queues.
DEFAULT_QUEUES = ("default",)
#: How Dramatiq names a queue's dead-letter queue.
XQ_TEMPLATE = "{queue}.XQ"


class _Held(NamedTuple):
    """One dead delivery taken, not yet acknowledged."""

    tag: int
    key: str
    message: Message[Any] | None  # ``None``: bytes that hold no Dramatiq message
    at: datetime | None
    body: bytes


class RabbitmqDeadLetters:
    """``DeadLetterStore`` over a ``RabbitmqBroker``'s ``.XQ`` queues."""

    framework = "dramatiq"

    def __init__(self, broker: Any, records: JobRecords, queues: Sequence[str], *,
                 discover: bool = False, management: str | None = None) -> None:
        self.broker = broker
        self.records = records
        self.extra = list(queues)
        self.discover = discover
        self.management = management
        self._connection: Any = None
        self._coverage: Coverage | None = None

    def queues(self) -> list[str]:
        known = {q for q in self.broker.get_declared_queues() if not q.endswith((".DQ", ".XQ"))}
        known |= set(self.extra)
        listing = self._listing()
        if listing is not None and listing.names is not None:
            found = known | set(originals(listing.names, [XQ_TEMPLATE]).values())
            self._coverage = Coverage(_xqs(found), True, listing.source)
            return sorted(found)
        defaults = {q for q in DEFAULT_QUEUES if self.discover} - known
        reason = "RabbitMQ cannot list queues over AMQP"
        reason += f"; {listing.source}" if listing else ""
        self._coverage = Coverage(_xqs(known | defaults), False, reason)
        return sorted(known | {q for q in defaults if self._exists(xq_name(q))})

    def coverage(self) -> Coverage:
        if self._coverage is None:
            self.queues()
        assert self._coverage is not None
        return self._coverage

    def scan(self, queue: str | None = None) -> list[DeadLetter]:
        letters: list[DeadLetter] = []
        for name in [queue] if queue else self.queues():
            with self._held(name) as (_channel, held):
                letters += [dead_letter_of(h.message, key=h.key, at=h.at) if h.message
                            else undecodable_letter(h.body, queue=name, key=h.key, at=h.at)
                            for h in held]
        return letters

    def remove(self, letters: Sequence[DeadLetter]) -> list[str]:
        removed: list[str] = []
        for name in sorted({x.queue for x in letters}):
            # One message per letter named: two copies of one dead letter are two letters.
            wanted = Counter(x.key for x in letters if x.queue == name)
            with self._held(name) as (channel, held):
                for h in held:
                    if wanted[h.key] > 0:
                        wanted[h.key] -= 1
                        channel.basic_ack(h.tag)
                        removed.append(h.key)
        return removed

    def requeue(self, moves: Sequence[tuple[DeadLetter, ReplayMark]]) -> list[str]:
        moved: list[str] = []
        for name in sorted({x.queue for x, _ in moves}):
            wanted = {x.key: (x, m) for x, m in moves if x.queue == name}
            self._ensure(name)
            with self._held(name, transaction=True) as (channel, held):
                for h in held:
                    if h.key not in wanted or h.message is None:  # no job to send: stays
                        continue
                    letter, mark = wanted.pop(h.key)
                    self.records.mark(letter, mark)
                    copy = replay_message(h.message, mark)
                    channel.basic_publish(
                        exchange="", routing_key=name, body=copy.encode(),
                        properties=pika.BasicProperties(
                            delivery_mode=2, priority=copy.options.get("broker_priority")))
                    channel.basic_ack(h.tag)
                    moved.append(letter.id)
        return moved

    def clear(self, queue: str) -> int:
        channel = self._open()
        try:
            return int(channel.queue_purge(xq_name(queue)).method.message_count)
        except ChannelClosedByBroker as exc:
            if exc.reply_code != NOT_FOUND:
                raise
            return 0
        finally:
            if channel.is_open:
                channel.close()

    def close(self) -> None:
        if self._connection is not None and self._connection.is_open:
            self._connection.close()
        self._connection = None

    def _listing(self) -> QueueListing | None:
        if not self.discover or self.management == MANAGEMENT_OFF:
            return None
        return list_queues(_address(self.broker), url=self.management)

    def _exists(self, queue: str) -> bool:
        channel = self._open()
        try:
            with NotFoundQuiet():  # a missing .XQ is an expected answer, not a warning
                channel.queue_declare(queue, passive=True)
            return True
        except ChannelClosedByBroker as exc:
            if exc.reply_code != NOT_FOUND:
                raise
            return False
        finally:
            if channel.is_open:
                channel.close()

    def _ensure(self, queue: str) -> None:
        """Declare ``queue`` the broker's way if it is gone; leave an existing one as it is.

        (Declaring an existing queue with other arguments, say without the workers'
        ``x-max-priority``, is an AMQP error.)
        """
        if not self._exists(queue):
            self.broker.declare_queue(queue, ensure=True)

    def _open(self) -> Any:
        if self._connection is None or not self._connection.is_open:
            self._connection = pika.BlockingConnection(self.broker.parameters)
        return self._connection.channel()

    @contextmanager
    def _held(self, queue: str, *,
              transaction: bool = False) -> Iterator[tuple[Any, list[_Held]]]:
        """Every message of ``queue``'s ``.XQ``, taken on a fresh channel; the rest go back.

        Acks made in the block stand (committed at the end in a transaction);
        anything else is requeued. An exception closes the channel uncommitted.
        """
        channel = self._open()
        held: list[_Held] = []
        try:
            if transaction:
                channel.tx_select()
            try:
                held = _take_all(channel, xq_name(queue))
            except ChannelClosedByBroker as exc:
                if exc.reply_code != NOT_FOUND:
                    raise
                yield channel, []
                return
            yield channel, held
            channel.basic_nack(delivery_tag=0, multiple=True, requeue=True)
            if transaction:
                channel.tx_commit()
        finally:
            if channel.is_open:
                channel.close()  # returns whatever is still unacknowledged


def _xqs(queues: set[str]) -> tuple[str, ...]:
    return tuple(sorted(xq_name(q) for q in queues))


def _address(broker: Any) -> AmqpAddress:
    """Where ``broker`` connects (its first connection parameters, if it has several)."""
    parameters = broker.parameters
    first = parameters[0] if isinstance(parameters, list) else parameters
    credentials = first.credentials
    return AmqpAddress(first.host, first.virtual_host, getattr(credentials, "username", ""),
                       getattr(credentials, "password", ""), first.ssl_options is not None)


def _take_all(channel: Any, queue: str) -> list[_Held]:
    """Every message ``queue`` holds, unacknowledged.

    A consumer first (far faster than gets) for the count read at the start; then
    gets for whatever became ready meanwhile (a message another channel just gave
    back can reach the queue a moment after that channel closed).
    """
    held: list[_Held] = []
    count = channel.queue_declare(queue, passive=True).method.message_count
    if count:
        for method, properties, body in channel.consume(queue, inactivity_timeout=_IDLE):
            if method is None:  # fewer than counted: expired, or taken by another reader
                break
            held.append(_delivery(method, properties, body))
            if len(held) >= count:
                break
        channel.cancel()  # gives back what was delivered beyond ``count``
    while True:
        method, properties, body = channel.basic_get(queue, auto_ack=False)
        if method is None:
            return held
        held.append(_delivery(method, properties, body))


def _delivery(method: Any, properties: Any, body: bytes) -> _Held:
    message = decoded(body)
    digest = hashlib.sha1(body, usedforsecurity=False).hexdigest()[:16]
    name = "undecodable" if message is None else message.message_id
    return _Held(method.delivery_tag, f"{name}:{digest}", message, _death_time(properties),
                 body)


def _death_time(properties: Any) -> datetime | None:
    """When RabbitMQ dead-lettered the message (its first ``x-death`` entry), if it says."""
    deaths = (properties.headers or {}).get("x-death") or []
    moment = deaths[0].get("time") if deaths and isinstance(deaths[0], dict) else None
    if isinstance(moment, datetime):
        return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)
    return None
