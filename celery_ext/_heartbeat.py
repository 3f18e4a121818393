"""The visibility heartbeat: an OjsTask delivery on Redis stays reserved while its worker lives.

Kombu's Redis transport emulates acks: a delivered message waits in the
``unacked`` hash, indexed by delivery time in the ``unacked_index`` sorted set,
and every consumer's ``QoS.restore_visible`` sweep puts a message back on its
queue once its score is older than ``visibility_timeout``, whether or not the
worker holding it is alive. A job running longer than that, or a retry whose
countdown a worker waits out in memory (an unacked ETA message), would be handed
out a second time while its first holder still has it; the second delivery
would count as a lost attempt and the job would run again.

So the adapter heartbeats (ojs-retry.md section 9.3, RET-13): ``OjsRequest``,
in the worker's main process (the one that holds the delivery and acks it),
holds every OjsTask message it receives on a Redis channel (``hold``), from
the moment it is received (prefetched, or waiting for its ETA) until it is
acked, rejected or requeued, or its channel closes. One daemon thread per
process sets the score of each held delivery tag to the current time every
``visibility_timeout / 4`` seconds (at least once a minute), with ``ZADD ... XX``
through the channel's own client (so kombu's ``global_keyprefix``) on the
channel's own ``unacked_index_key``. ``XX`` only updates: a tag that was acked
or restored meanwhile is never added back. The sweep's score check then never
matches a held message.

When the worker process dies (SIGKILL, OOM, power loss), the heartbeat dies
with it: the score ages and kombu's restore hands the message out again after
``visibility_timeout``, where the job record makes the redelivery count as the
lost attempt it is (RET-12, ``_attempt``); a held retry whose attempt never
started simply runs.

Limits:

- The heartbeat shows that the worker process is alive, not that the task is
  making progress: a hung task body keeps its message reserved (as on
  RabbitMQ); bound it with a time limit.
- A heartbeat that cannot reach Redis for longer than ``visibility_timeout``
  minus one interval (a Redis outage, a frozen or starved process: under the
  eventlet/gevent pools the thread is green, and a task that blocks the hub
  starves it) lets the message be restored and handed out again; the second
  delivery is then counted as a lost attempt. Keep the timeout well above the
  longest such pause (the timeout now only bounds how soon a dead worker's
  messages come back).
- The sweep and the worker compare wall clocks: skew between hosts larger than
  that margin restores held messages, as it would without the heartbeat.
- A closed channel (worker shutdown, a lost broker connection) ends the
  heartbeat of its messages: kombu restores them as it closes the channel (a job
  still running at that moment is handed out again). If Redis is unreachable
  then (a restart), kombu would leave them for the timeout; the heartbeat notices
  the closed channel within ``CLOSE_CHECK`` seconds and hands them back itself as
  soon as Redis answers (``_orphans``, issue 8).
- Only OjsTask messages are held; other tasks keep kombu's plain behaviour.
- App setting ``ojs_visibility_heartbeat = False`` turns it off.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery_ext._orphans import hand_back

logger = logging.getLogger("celery_ext")

#: App setting: ``False`` turns the heartbeat off (on by default).
HEARTBEAT_SETTING = "ojs_visibility_heartbeat"
#: A held delivery is refreshed every ``visibility_timeout / SLICES`` seconds...
SLICES = 4
#: ... but at least this often, and at most this often (seconds).
MAX_INTERVAL = 60.0
MIN_INTERVAL = 0.05
#: While anything is held (or waits to be handed back), look at least this often (seconds)
#: for a closed channel; it costs no Redis call.
CLOSE_CHECK = 1.0


@dataclass
class _Held:
    """One held delivery: its message, its channel, and when to refresh it next.

    ``owner`` is the kombu connection it came over, and ``stamp`` the last score the
    heartbeat set (at first, when it began to hold it): ``_orphans`` needs both.
    """

    message: Any
    channel: Any
    interval: float
    due: float
    owner: Any = None
    stamp: float = 0.0


def heartbeat_interval(visibility_timeout: float) -> float:
    """Seconds between two refreshes of one delivery.

    >>> heartbeat_interval(2), heartbeat_interval(3600)
    (0.5, 60.0)
    """
    return min(max(float(visibility_timeout) / SLICES, MIN_INTERVAL), MAX_INTERVAL)


def redis_channel(channel: Any) -> bool:
    """Whether ``channel`` is a kombu Redis channel with ack emulation (a visibility timeout).

    Looked up, never imported: ``kombu.transport.redis`` fails to import without
    redis-py (a RabbitMQ setup), and a Redis channel exists only once it is loaded.
    """
    module = sys.modules.get("kombu.transport.redis")
    return module is not None and isinstance(getattr(channel, "qos", None), module.QoS)


class Heartbeat:
    """Refreshes the ``unacked_index`` score of every held delivery, from one thread."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._held: dict[int, _Held] = {}
        self._orphans: list[_Held] = []  # closed unacked: to hand back (``_orphans``)
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def hold(self, message: Any, *, start: bool = True) -> bool:
        """Keep ``message`` reserved until it is acked or its channel closes.

        Returns whether it is held (only deliveries on a Redis channel are).
        ``start=False`` leaves the thread unstarted (``tick`` does the work).
        """
        channel: Any = getattr(message, "channel", None)
        if not redis_channel(channel) or getattr(message, "acknowledged", True):
            return False
        interval = heartbeat_interval(channel.visibility_timeout)
        with self._lock:
            if self._pid != os.getpid():  # a forked child holds nothing of its parent's
                self._held.clear()
                self._orphans.clear()
                self._thread, self._pid = None, os.getpid()
            now = self.clock()
            owner = getattr(getattr(channel, "connection", None), "client", None)
            self._held[id(message)] = _Held(message, channel, interval, now + interval,
                                            owner, now)
            if start and (self._thread is None or not self._thread.is_alive()):
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="ojs-visibility-heartbeat")
                self._thread.start()
        self._wake.set()
        return True

    def held(self) -> int:
        """How many deliveries are held now."""
        with self._lock:
            return len(self._held)

    def tick(self) -> float | None:
        """Refresh every delivery that is due; forget those acked; hand back those whose
        channel closed unacked (``_orphans``).

        Returns when to tick next (``None``: nothing is held or waits to be handed back).
        """
        now = self.clock()
        due: dict[int, list[_Held]] = {}
        with self._lock:
            for key, held in list(self._held.items()):
                if held.message.acknowledged:
                    del self._held[key]
                elif getattr(held.channel, "closed", False):
                    del self._held[key]
                    self._orphans.append(held)
                elif held.due <= now:
                    due.setdefault(id(held.channel), []).append(held)
            # Past its visibility timeout kombu's sweep hands an orphan out by itself.
            orphans = [held for held in self._orphans
                       if now - held.stamp < float(getattr(held.channel, "visibility_timeout", 0))]
            self._orphans = []
        for batch in due.values():
            self._refresh(batch, now)
        left = hand_back(orphans) if orphans else []
        with self._lock:
            self._orphans.extend(left)
            if not self._held and not self._orphans:
                return None
            return min([held.due for held in self._held.values()] + [now + CLOSE_CHECK])

    def _refresh(self, batch: list[_Held], now: float) -> None:
        channel = batch[0].channel
        try:
            with channel.conn_or_acquire() as client:
                pipe = client.pipeline(transaction=False)
                for held in batch:
                    pipe.zadd(channel.unacked_index_key, {held.message.delivery_tag: now},
                              xx=True)
                pipe.execute()
        except Exception as error:  # the next tick tries again; the margin is 3/4 timeout
            logger.warning("ojs-adapters: visibility heartbeat of %d deliveries failed: %r",
                           len(batch), error)
        for held in batch:
            held.due, held.stamp = now + held.interval, now

    def _run(self) -> None:
        while True:
            self._wake.clear()
            try:
                next_due = self.tick()
            except Exception:  # never let the thread die: held jobs would be handed out
                logger.exception("ojs-adapters: visibility heartbeat tick failed")
                next_due = self.clock() + MIN_INTERVAL * 10
            timeout = None if next_due is None else max(0.0, next_due - self.clock())
            self._wake.wait(timeout)


#: The process's heartbeat (one thread, started by the first delivery it holds).
HEARTBEAT = Heartbeat()


def hold(message: Any, app: Any) -> bool:
    """Hold ``message`` (an OjsTask delivery) in the process heartbeat, unless ``app`` turned
    it off (``ojs_visibility_heartbeat = False``); see the module docstring."""
    if not app.conf.get(HEARTBEAT_SETTING, True):
        return False
    try:
        return HEARTBEAT.hold(message)
    except Exception:  # never fail the receipt of a message over its heartbeat
        logger.warning("ojs-adapters: cannot hold a delivery in the visibility heartbeat",
                       exc_info=True)
        return False
