"""What the Celery driver reads and removes on a broker: dead letters, a run's queues and keys.

Dead letters are peeked, never consumed: ``memory://`` queues are read in
place, Redis lists by ``LRANGE``, RabbitMQ queues by ``basic_get`` without an
ack (closing the channel puts the messages back). A Celery message names its
task id in the ``id`` header (protocol 2).

>>> broker_kind("memory"), broker_kind("redis://127.0.0.1:6379/0"), broker_kind("amqp://h//")
('memory', 'redis', 'amqp')
"""

from __future__ import annotations

import json
from contextlib import suppress
from typing import Any

from celery import Celery

from conformance.drivers import SCHEMES, UrlKind, url_kind

#: A broker kind the driver knows: the shared reader's.
Kind = UrlKind
#: The URL schemes the driver takes: kombu's ``pyamqp://`` too.
_SCHEMES: dict[str, Kind] = {**SCHEMES, "pyamqp": "amqp"}
#: Separator kombu's Redis transport puts between a queue's name and a priority level.
_REDIS_PRIORITY_SEP = "\x06\x16"
#: Priority levels kombu's Redis transport keeps in lists of their own (default steps).
_REDIS_PRIORITIES = (3, 6, 9)


def broker_kind(url: str) -> Kind:
    """Which broker a ``--ojs-broker`` URL names; ``ValueError`` for an unknown scheme."""
    kind = url_kind(url, _SCHEMES)
    if kind is None:
        raise ValueError(f"the Celery driver takes memory, redis://... or amqp://..., "
                         f"not {url!r}")
    return kind


def task_ids_in_queue(app: Celery, kind: Kind, queue: str, *, redis_prefix: str) -> set[str]:
    """Task ids of the messages now in ``queue``, which stay there."""
    if kind == "memory":
        headers = _memory_peek(queue)
    elif kind == "redis":
        headers = _redis_peek(app.conf.broker_url, f"{redis_prefix}:{queue}")
    else:
        headers = _amqp_peek(app, queue)
    return {str(h["id"]) for h in headers if h.get("id")}


def delete_queues(app: Celery, queues: list[str], exchanges: list[str]) -> None:
    """Delete ``exchanges`` and ``queues`` (memory://, RabbitMQ); missing ones are fine."""
    with app.connection_for_write() as conn:
        for name, delete in [*((e, "exchange_delete") for e in exchanges),
                             *((q, "queue_delete") for q in queues)]:
            channel = conn.channel()
            try:
                getattr(channel, delete)(name)
            except (*conn.channel_errors, KeyError):
                pass  # never declared (RabbitMQ closes the channel on a 404)
            finally:
                _close_quietly(channel)
    if app.conf.broker_url.startswith("memory"):
        from kombu.transport.memory import Channel

        for name in queues:  # its queue_delete drops only queues it knows bindings of
            Channel.queues.pop(name, None)


def delete_redis_keys(url: str, prefix: str) -> None:
    """Delete every key under ``prefix:`` in the Redis at ``url``."""
    client = _redis_client(url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=500))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def _memory_peek(queue: str) -> list[dict[str, Any]]:
    from kombu.transport.memory import Channel

    found = Channel.queues.get(queue)
    return [dict(m.get("headers") or {}) for m in list(found.queue)] if found else []


def _redis_peek(url: str, key: str) -> list[dict[str, Any]]:
    client = _redis_client(url)
    try:
        keys = [key, *(f"{key}{_REDIS_PRIORITY_SEP}{p}" for p in _REDIS_PRIORITIES)]
        return [dict(json.loads(raw).get("headers") or {})
                for name in keys for raw in client.lrange(name, 0, -1)]
    finally:
        client.close()


def _amqp_peek(app: Celery, queue: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    with app.connection_for_write() as conn:
        channel = conn.channel()
        try:
            while (message := channel.basic_get(queue, no_ack=False)) is not None:
                out.append(dict(message.headers or {}))
        except conn.channel_errors:
            pass  # no such queue: nothing was dead-lettered
        finally:
            _close_quietly(channel)  # unacked messages go back to the queue
    return out


def _close_quietly(channel: Any) -> None:
    with suppress(Exception):  # already closed by the broker (e.g. after a 404)
        channel.close()


def _redis_client(url: str) -> Any:
    import redis

    return redis.Redis.from_url(url)
