"""The visibility heartbeat: an OjsTask delivery on Redis stays reserved while its worker lives.

Kombu's Redis transport hands an unacked message out again once its score in
``unacked_index`` is older than ``visibility_timeout``, whether or not its worker is alive.
``OjsRequest`` holds each OjsTask delivery on a Redis channel here from receipt to ack, and
one daemon thread per process refreshes the held scores (``ZADD ... XX``) every
``visibility_timeout / 4`` seconds, at least once a minute (ojs-retry.md 9.3, RET-13). When
the process dies the heartbeat stops, and kombu hands the message out again as it would
have. How it works and its limits: docs/long-waits.md.
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

from celery_ext._conf import setting
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
        self._until: float | None = None  # when the thread looks next (None: idle)

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
            # Woken only if it would look too late: not once per delivery (a wake-up and a
            # walk over every held delivery, on the path of each message).
            wake = self._until is None or self._until > now + interval
        if wake:
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
                self._until = None
            else:
                self._until = min([held.due for held in self._held.values()]
                                  + [now + CLOSE_CHECK])
            return self._until

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
                next_due = self._until = self.clock() + MIN_INTERVAL * 10
            timeout = None if next_due is None else max(0.0, next_due - self.clock())
            self._wake.wait(timeout)


#: The process's heartbeat (one thread, started by the first delivery it holds).
HEARTBEAT = Heartbeat()


def hold(message: Any, app: Any) -> bool:
    """Hold ``message`` (an OjsTask delivery) in the process heartbeat, unless ``app`` turned
    it off (``ojs_visibility_heartbeat = False``); see docs/long-waits.md."""
    if not setting(app, HEARTBEAT_SETTING, True):
        return False
    try:
        return HEARTBEAT.hold(message)
    except Exception:  # never fail the receipt of a message over its heartbeat
        logger.warning("ojs-adapters: cannot hold a delivery in the visibility heartbeat",
                       exc_info=True)
        return False
