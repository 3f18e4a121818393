"""Celery dead letters through kombu's channel API: RabbitMQ (py-amqp) and ``memory://``.

A queue cannot be read without taking its messages, so each operation takes all
of a dead-letter queue's messages unacknowledged, acts on the ones it wants and
gives the rest back. Another reader of the
same queue at that moment sees it empty. On AMQP a replay runs in a transaction:
the copies' publishes and the dead deliveries' acks commit together, and a
client stopped before ``tx.commit`` changes nothing. ``memory://`` lives in the
process, so one step is atomic there.

Neither can list queues: the dead-letter queues looked at are those of the app's
queues and of the names given; on AMQP with ``discover``, also every queue the
management API lists that fits one of the app's dead-letter templates.
``coverage()`` says which it was.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from kombu.entity import Queue

from celery_ext._dlq_common import (
    JobRecords,
    dead_letter_of,
    dead_letter_queues,
    dead_letter_templates,
    replay_headers,
    shared,
)
from celery_ext._kombu_reads import close_channel as _close
from celery_ext._kombu_reads import consume_all as _consume_all
from celery_ext._kombu_reads import give_back as _give_back
from celery_ext._kombu_reads import not_found as _not_found
from celery_ext._kombu_reads import take_all as _take_all
from ojs_adapters.runtime.dlq import (
    MANAGEMENT_OFF,
    AmqpAddress,
    Coverage,
    DeadLetter,
    ReplayMark,
    list_queues,
    originals,
)

#: Properties a replayed copy keeps from the dead message.
_KEPT_PROPERTIES = ("priority", "correlation_id", "reply_to")


class KombuDeadLetters:
    """``DeadLetterStore`` over a Celery app's dead-letter queues, with kombu channels."""

    framework = "celery"

    def __init__(self, app: Any, queues: Sequence[str], records: JobRecords, *,
                 discover: bool = False, management: str | None = None) -> None:
        self.app = app
        self.records = records
        self.extra = list(queues)
        self.discover = discover
        self.management = management
        self._conn = app.connection_for_write()
        self._amqp = self._conn.transport.driver_type == "amqp"
        self._coverage: Coverage | None = None

    def _names(self) -> dict[str, str]:
        """``{dead-letter queue: original queue}`` to look at; notes the coverage."""
        names = dead_letter_queues(self.app, self.extra)
        if self._amqp and self.discover and self.management != MANAGEMENT_OFF:
            listing = list_queues(self._address(), url=self.management)
            if listing.names is not None:
                found = originals(listing.names, dead_letter_templates(self.app))
                names = {**found, **names}
                self._coverage = Coverage(tuple(sorted(names)), True, listing.source)
                return names
            reason = f"RabbitMQ cannot list queues over AMQP; {listing.source}"
        elif self._amqp:
            reason = "RabbitMQ cannot list queues over AMQP"
        else:
            reason = f"kombu's {self._conn.transport.driver_type} transport cannot list queues"
        self._coverage = Coverage(tuple(sorted(names)), False, reason)
        return names

    def queues(self) -> list[str]:
        templates, found = dead_letter_templates(self.app), set()
        for dead, original in self._names().items():
            found.add(original)
            if shared(dead, original, templates):  # the queues its letters name, too
                with self._held(dead) as (_channel, held):
                    found.update(self._letter(m, original).queue for m in held)
        return sorted(found)

    def coverage(self) -> Coverage:
        if self._coverage is None:
            self._names()
        assert self._coverage is not None
        return self._coverage

    def scan(self, queue: str | None = None) -> list[DeadLetter]:
        letters: list[DeadLetter] = []
        templates = dead_letter_templates(self.app)
        for dead, original in self._names().items():
            if queue in (None, original) or shared(dead, original, templates):
                with self._held(dead) as (_channel, held):
                    letters += [self._letter(m, original) for m in held]
        return [x for x in letters if queue in (None, x.queue)]  # a shared queue: each its own

    def _held_where(
        self, letters: Sequence[DeadLetter]
    ) -> Iterator[tuple[str, str, Counter[str]]]:
        """``(dead-letter queue, its original queue, how many of letters it may hold, by key)``
        for each dead-letter queue: a shared one may hold any of them."""
        templates = dead_letter_templates(self.app)
        for dead, original in self._names().items():
            mixed = shared(dead, original, templates)
            yield dead, original, Counter(x.key for x in letters if mixed or x.queue == original)

    def remove(self, letters: Sequence[DeadLetter]) -> list[str]:
        removed: list[str] = []
        # One message per letter named: two copies of one dead letter are two letters.
        for dead, original, wanted in self._held_where(letters):
            if not wanted:
                continue
            with self._held(dead) as (_channel, held):
                for message in held:
                    key = self._letter(message, original).key
                    if wanted[key] > 0:
                        wanted[key] -= 1
                        message.ack()
                        removed.append(key)
        return removed

    def requeue(self, moves: Sequence[tuple[DeadLetter, ReplayMark]]) -> list[str]:
        moved: list[str] = []
        for dead, original, held_here in self._held_where([x for x, _ in moves]):
            wanted = {x.key: (x, m) for x, m in moves if x.key in held_here}
            if not wanted:
                continue
            for target in sorted({x.queue for x, _ in wanted.values()}):
                self._ensure(target)
            with self._held(dead, transaction=self._amqp) as (channel, held):
                for message in held:
                    key = self._letter(message, original).key
                    if key not in wanted:
                        continue
                    letter, mark = wanted.pop(key)
                    self.records.mark(letter, mark)
                    self._publish(channel, message, letter.queue, mark)  # the queue it names
                    message.ack()
                    moved.append(letter.id)
        return moved

    def clear(self, queue: str) -> int:
        removed = 0
        templates = dead_letter_templates(self.app)
        for dead, original in self._names().items():
            if shared(dead, original, templates):  # only ``queue``'s letters go
                with self._held(dead) as (_channel, held):
                    for message in held:
                        if self._letter(message, original).queue == queue:
                            message.ack()
                            removed += 1
            elif original == queue:
                channel = self._conn.channel()
                try:
                    removed += int(Queue(dead, channel=channel).purge() or 0)  # type: ignore[no-untyped-call]
                except Exception as exc:
                    if not _not_found(exc):
                        raise
                finally:
                    _close(channel)
        return removed

    def close(self) -> None:
        self._conn.release()

    def _address(self) -> AmqpAddress:
        conn = self._conn
        return AmqpAddress(conn.hostname or "localhost", conn.virtual_host or "/",
                           conn.userid or "", conn.password or "", bool(conn.ssl))

    def _ensure(self, queue: str) -> None:
        """Declare ``queue`` if it is gone (as the app configures it, else plain and durable).

        A publish to a missing queue through the default exchange is dropped
        silently; the dead letter must not be acked for nothing.
        """
        channel = self._conn.channel()
        try:
            Queue(queue, channel=channel).queue_declare(passive=True)  # type: ignore[no-untyped-call]
        except Exception as exc:
            if not _not_found(exc):
                raise
            _close(channel)
            channel = self._conn.channel()
            declared = self.app.amqp.queues.get(queue) or Queue(  # type: ignore[no-untyped-call]
                queue, routing_key=queue, durable=True)
            declared.bind(channel).declare()
        finally:
            _close(channel)

    def _letter(self, message: Any, original: str) -> DeadLetter:
        return dead_letter_of(body=message.body, content_type=message.content_type,
                              content_encoding=message.content_encoding,
                              headers=message.headers or {}, properties=message.properties or {},
                              queue=original, accept=self.app.conf.accept_content)

    def _publish(self, channel: Any, message: Any, queue: str, mark: ReplayMark) -> None:
        properties = message.properties or {}
        extra = {k: properties[k] for k in _KEPT_PROPERTIES if properties.get(k) is not None}
        body = channel.prepare_message(
            message.body, priority=extra.pop("priority", None),
            content_type=message.content_type, content_encoding=message.content_encoding,
            headers=replay_headers(message.headers or {}, mark),
            properties={"delivery_mode": 2, **extra})
        channel.basic_publish(body, exchange="", routing_key=queue)

    @contextmanager
    def _held(self, queue: str, *, transaction: bool = False) -> Iterator[tuple[Any, list[Any]]]:
        """Every message of dead-letter ``queue``, taken; the rest go back at the end.

        On an error: AMQP rolls back by closing the channel (the broker returns the
        deliveries); ``memory://`` drops unacknowledged messages on close, so they
        are put back first.
        """
        channel = self._conn.channel()
        held: list[Any] = []
        finished = False
        try:
            if transaction:
                channel.tx_select()
            try:
                if self._amqp:
                    _consume_all(self._conn, channel, queue, held)
                _take_all(channel, queue, held)
            except Exception as exc:
                if not _not_found(exc):
                    raise
            yield channel, held
            _give_back(held)
            if transaction:
                channel.tx_commit()
            finished = True
        finally:
            if not finished and not transaction:
                _give_back(held)
            _close(channel)
