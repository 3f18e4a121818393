"""Reading a whole kombu queue without losing a message: taken unacknowledged, given back.

Used by the dead-letter store over kombu channels (``_dlq_kombu``): RabbitMQ (py-amqp)
and ``memory://`` cannot list a queue, only take its messages.
"""

from __future__ import annotations

import time
from contextlib import suppress
from typing import Any

from kombu.entity import Queue

#: Longest wait, in seconds, for messages given back by an earlier operation.
SETTLE = 1.0


def take_all(channel: Any, name: str, held: list[Any]) -> None:
    """Take every message of queue ``name`` into ``held``.

    A message another channel just gave back may reach the queue a moment after
    that channel closed: until the count read at the start is reached, an empty
    read is retried for up to ``SETTLE`` seconds.
    """
    queue: Any = Queue(name, channel=channel, no_declare=True)  # type: ignore[no-untyped-call]
    count = queue.queue_declare(passive=True).message_count
    deadline = time.monotonic() + SETTLE
    while True:
        message = queue.get(no_ack=False, accept=None)
        if message is not None:
            held.append(message)
        elif len(held) >= count or time.monotonic() > deadline:
            return
        else:
            time.sleep(0.02)


def consume_all(conn: Any, channel: Any, name: str, held: list[Any]) -> None:
    """AMQP: take what ``name`` holds through a consumer (many times faster than gets).

    Prefetch is the count read at the start, so nothing beyond it is delivered;
    ``take_all`` then gets whatever became ready meanwhile.
    """
    count = int(channel.queue_declare(queue=name, passive=True).message_count)
    if not count:
        return
    channel.basic_qos(0, min(count, 65535), False)
    tag = channel.basic_consume(
        queue=name, no_ack=False,
        callback=lambda raw: held.append(channel.message_to_python(raw)))
    try:
        while len(held) < count:
            conn.drain_events(timeout=SETTLE)
    except TimeoutError:  # fewer than counted: expired, or taken by another reader
        pass
    finally:
        channel.basic_cancel(tag)


def give_back(held: list[Any]) -> None:
    for message in held:
        if not message.acknowledged:
            message.reject(requeue=True)


def not_found(exc: Exception) -> bool:
    """A missing queue: AMQP 404, or a virtual transport's ``NOT_FOUND``."""
    text = str(exc).lower()
    return getattr(exc, "code", None) == 404 or getattr(exc, "reply_code", None) == 404 \
        or "not_found" in text or "not found" in text


def close_channel(channel: Any) -> None:
    with suppress(Exception):  # already closed by a broker error
        channel.close()
