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

- **RabbitMQ**: the binary delay topology of kombu's native delayed delivery
  (``kombu.transport.native_delayed_delivery``, which Celery uses for quorum
  queues), under our own names (``ojs_park_prefix``, default ``ojs``): 28
  queues ``<prefix>_celery_delayed_<n>`` with a message TTL of 2**n s, each
  dead-lettering to the next level, and the topic exchange
  ``<prefix>_celery_delayed_delivery``. The retry is published (confirmed,
  mandatory) to level 27 with the routing key ``<28 bits of whole
  seconds>.<queue>``; it waits in each level whose bit is set, and the
  delivery exchange routes it to ``<queue>`` by the binding
  ``*.*.(28 words)...*.<queue>``, an exact match whatever the queue's exchange
  type (Celery's own variant needs topic exchanges). The levels are declared
  once per process, as ``broker_native_delayed_delivery_queue_type`` says
  (Celery's setting, default ``quorum``: at-least-once dead-lettering, so a
  broker crash between two levels loses nothing; the attempt claim drops a
  doubled copy); the binding before every park. One fixed set of queues
  serves every queue of the vhost and any delay up to 2**28 s (a longer one
  waits the rest in the worker). An arriving retry names a delay exchange and
  the bit-prefixed key: ``restore_delivery_info`` (``OjsRequest``) makes it an
  anonymous delivery to ``<queue>`` again, so routing, the record and the next
  retry see the queue. ``x-death`` headers are never copied into a retry
  (``_headers``): RabbitMQ drops a message dead-lettered into a level its
  ``x-death`` shows it expired from before, as a cycle. AMQP cannot list the levels,
  so each parked retry is also noted in the console's index (``_waiting.index_parked``:
  one round trip to the Redis result backend, if that is the backend).
- **Redis**: the envelope kombu's ``_put`` would push (built by the channel's
  own ``_inplace_augment_message``: delivery tag, delivery info, body
  encoding) goes into the sorted set ``_ojs.parked`` (under the transport's
  ``global_keyprefix``), scored by its exact due time, with the list key
  ``_put`` would use (priority suffix included). Each worker's main process
  runs a ``Mover`` (a consumer bootstep ``OjsTask`` adds to its app): every
  ``ojs_park_poll_interval`` s (default 0.5) one Lua script moves the entries
  due within ``LEAD`` s onto their lists (``LPUSH``, as ``_put``) and removes
  them from the set, atomically: nothing lost, nothing moved twice by two
  workers, as durable as the broker's Redis. With no worker running, parked
  retries wait in the set.

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

import contextlib
import logging
import os
import re
import threading
import time
from collections.abc import Mapping
from typing import Any

from celery import bootsteps
from kombu.transport.native_delayed_delivery import (
    CELERY_DELAYED_DELIVERY_EXCHANGE,
    MAX_LEVEL,
    MAX_NUMBER_OF_BITS_TO_USE,
    calculate_routing_key,
    declare_native_delayed_delivery_exchanges_and_queues,
    level_name,
)
from kombu.utils.json import dumps

from ojs_adapters._periodic import Periodic
from ojs_adapters.delay_levels import binding_key, routable
from ojs_adapters.errors import OjsValidationError
from ojs_adapters.parking import DEFAULT_PARK_AFTER, LEAD, park_threshold

logger = logging.getLogger("celery_ext")

#: App setting: park retries left to wait more than this many seconds (``None``: never).
PARK_SETTING = "ojs_park_after"
#: App setting: name prefix of the RabbitMQ delay levels and delivery exchange.
PREFIX_SETTING = "ojs_park_prefix"
DEFAULT_PREFIX = "ojs"
#: App setting: seconds between two moves of due Redis entries.
POLL_SETTING = "ojs_park_poll_interval"
DEFAULT_POLL = 0.5
#: The Redis sorted set of parked envelopes (kombu's client adds the ``global_keyprefix``).
PARKED_KEY = "_ojs.parked"
#: Most entries one script run moves.
BATCH = 500
#: Longest park on RabbitMQ (28 bits of seconds); a longer countdown waits the rest natively.
MAX_PARK = 2 ** MAX_NUMBER_OF_BITS_TO_USE - 1
#: A delay-level routing key: 28 bits, then the destination.
_BITS = re.compile(rf"^(?:[01]\.){{{MAX_NUMBER_OF_BITS_TO_USE}}}")
#: Seconds before a failed declaration of the RabbitMQ levels is tried again.
RETRY_DECLARE = 60.0

#: Moves the due entries of KEYS[1] (score <= ARGV[1], at most ARGV[2]) to their lists.
#: A member is ``<byte length of the list key>:<list key><payload>``.
_MOVE = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, member in ipairs(due) do
  local colon = string.find(member, ':', 1, true)
  local size = tonumber(string.sub(member, 1, colon - 1))
  redis.call('LPUSH', string.sub(member, colon + 1, colon + size),
             string.sub(member, colon + size + 1))
  redis.call('ZREM', KEYS[1], member)
end
return #due
"""


def park_after(app: Any) -> float | None:
    """The app's parking threshold in seconds (at least 1), or ``None`` if parking is off.

    An invalid setting falls back to the default (the worker-start check reports it):
    the retry being handed off is no place to fail.
    """
    try:
        return park_threshold(app.conf.get(PARK_SETTING, DEFAULT_PARK_AFTER), field=PARK_SETTING)
    except OjsValidationError:
        return DEFAULT_PARK_AFTER


def prefix_of(app: Any) -> str:
    """The name prefix of the app's RabbitMQ delay levels."""
    return str(app.conf.get(PREFIX_SETTING) or DEFAULT_PREFIX)


def delivery_exchange(prefix: str) -> str:
    """The topic exchange the last delay level dead-letters to."""
    return f"{prefix}_{CELERY_DELAYED_DELIVERY_EXCHANGE}"


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


def restore_delivery_info(message: Any, app: Any) -> None:
    """Make a retry that came back from the RabbitMQ delay levels an anonymous delivery to
    its queue (as Celery's own retries are), in place; anything else is left alone."""
    info = getattr(message, "delivery_info", None)
    if not isinstance(info, dict):
        return
    exchange, key = str(info.get("exchange") or ""), str(info.get("routing_key") or "")
    if not exchange.startswith(f"{prefix_of(app)}_celery_delayed_"):
        return
    bits = _BITS.match(key)
    if bits is not None and key[bits.end():]:
        info["exchange"], info["routing_key"] = "", key[bits.end():]


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
                message, exchange=level_name(MAX_LEVEL, self.prefix),
                routing_key=calculate_routing_key(seconds, self.queue),
                **{**kwargs, "mandatory": True})
        except Exception:
            _TOPOLOGY.forget(self.prefix)  # declared again on the next try (the hand-off's)
            raise
        from celery_ext._waiting import index_parked  # (it imports this module)

        index_parked(self.app, message, self.queue, self.not_before)  # the console lists it
        return sent


class _RedisPark(_Park):
    """Add the envelope ``_put`` would push to the parked set, scored by its due time."""

    def publish(self, channel: Any, message: Any, exchange: str, routing_key: str,
                kwargs: Mapping[str, Any]) -> Any:
        channel._inplace_augment_message(message, exchange, routing_key)
        priority = channel._get_message_priority(message, reverse=False)
        target = channel.global_keyprefix + channel._q_for_pri(self.queue, priority)
        payload: str = dumps(message)  # type: ignore[no-untyped-call]  # as ``_put``
        member = f"{len(target.encode())}:{target}{payload}"
        with channel.conn_or_acquire() as client:
            client.zadd(PARKED_KEY, {member: self.not_before})


class _Topology:
    """The RabbitMQ delay levels, declared once per process (and prefix, and broker)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._declared: set[tuple[int, str, str]] = set()
        self._failed: dict[tuple[int, str, str], float] = {}

    def ensure(self, app: Any, conn: Any) -> bool:
        """Declare the levels if this process has not; ``False`` if they are unavailable.

        A connection error is raised (the hand-off retries it); a channel error (the
        levels exist with other arguments, an old broker) is logged and parks nothing
        for ``RETRY_DECLARE`` s.
        """
        prefix = prefix_of(app)
        key = (os.getpid(), prefix, conn.as_uri())
        with self._lock:
            if key in self._declared:
                return True
            if time.monotonic() - self._failed.get(key, -RETRY_DECLARE) < RETRY_DECLARE:
                return False
            queue_type = str(app.conf.get("broker_native_delayed_delivery_queue_type")
                             or "quorum")
            with app.connection_for_write() as fresh:
                try:
                    declare_native_delayed_delivery_exchanges_and_queues(
                        fresh, queue_type, prefix)
                except fresh.connection_errors:
                    raise
                except Exception as error:
                    self._failed[key] = time.monotonic()
                    logger.error("ojs-adapters: cannot declare the RabbitMQ delay levels "
                                 "%s_celery_delayed_* (%s queues): %r; long retries wait "
                                 "in the worker", prefix, queue_type, error)
                    return False
            self._declared.add(key)
            return True

    def forget(self, prefix: str) -> None:
        """Declare the levels of ``prefix`` again on their next use."""
        with self._lock:
            self._declared = {k for k in self._declared if k[1] != prefix}


_TOPOLOGY = _Topology()


class Mover:
    """Moves due entries of the parked set to their Redis lists, from one daemon thread."""

    def __init__(self, app: Any, interval: float | None = None) -> None:
        self.app = app
        self.interval = float(interval if interval is not None else
                              app.conf.get(POLL_SETTING) or DEFAULT_POLL)
        self._runner = Periodic("ojs-park-mover", self._round, self.interval,
                                on_error=self._close, logger=logger)
        self._connection: Any = None
        self._script: Any = None
        self._client: Any = None

    def move_due(self, now: float | None = None) -> int:
        """Move every entry due by ``now + LEAD`` (default: the time now); how many moved."""
        client = self._redis()
        horizon = (time.time() if now is None else now) + max(LEAD, self.interval)
        moved = 0
        while True:
            count = int(self._script(keys=[PARKED_KEY], args=[repr(horizon), BATCH],
                                     client=client))
            moved += count
            if count < BATCH:
                return moved

    def start(self) -> None:
        """Start the thread (a no-op if it runs)."""
        self._runner.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread and close its connection."""
        self._runner.stop(timeout)
        self._close()

    def _redis(self) -> Any:
        if self._client is None:
            self._connection = self.app.connection_for_write()
            # the channel's own client: kombu's global_keyprefix, on the set key too
            with self._connection.default_channel.conn_or_acquire() as client:
                self._client = client
            self._script = client.register_script(_MOVE)
        return self._client

    def _close(self) -> None:
        connection, self._connection, self._client = self._connection, None, None
        if connection is not None:
            with contextlib.suppress(Exception):  # closing a broken connection
                connection.close()

    def _round(self) -> None:
        moved = self.move_due()  # an error: ``Periodic`` logs it and calls ``_close``
        if moved:
            logger.debug("ojs-adapters: moved %d parked retries to their queues", moved)


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
