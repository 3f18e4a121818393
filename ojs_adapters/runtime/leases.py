"""Attempt leases: a second delivery of an attempt waits while the first one is alive.

A broker can hand a message out again while its first delivery still runs; judged alone,
that second delivery would record a phantom lost attempt (RET-12). So each delivery first
takes a lease on its attempt in the record store, renewed by a ``LeaseRenewer`` thread:
another delivery waits while the lease is alive, and counts a lost attempt only once it
lapses (the heartbeat of ojs-retry.md 9.3, RET-13, for redeliveries). Why, and the
limits: docs/lifecycle.md.

>>> class Store:  # a store keeps leases if it has ``lease(key, holder, ttl_ms)``
...     held = {}
...     def lease(self, key, holder, ttl):
...         return self.held.setdefault(key, holder) == holder
>>> [lease(Store(), "job:2", h, 6000) for h in ("a|1", "b|1", "a|1")], lease(object(), "k", "h", 1)
([True, False, True], None)
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

logger = logging.getLogger("ojs_adapters.leases")  # its name before the runtime split

#: How long a lease outlives its last renewal, in seconds: how long a redelivery after
#: a crash waits before it counts the lost attempt.
LEASE_SECONDS = 6.0
#: How often a ``LeaseRenewer`` renews the leases it holds, in seconds: a store outage of up to
#: ``LEASE_SECONDS - BEAT_SECONDS`` (5 s) leaves a live lease alive.
BEAT_SECONDS = 1.0
#: How often a delivery waiting for another one's lease looks again, in seconds.
WAIT_SECONDS = 0.5

#: Take or renew the lease KEYS[1] for holder ARGV[1], for ARGV[2] ms: 1, or 0 if held
#: by another holder.
LEASE_LUA = """
local held = redis.call("GET", KEYS[1])
if held and held ~= ARGV[1] then return 0 end
redis.call("SET", KEYS[1], ARGV[1], "PX", ARGV[2])
return 1
"""


#: Release the lease KEYS[1] if holder ARGV[1] holds it: 1, else 0.
RELEASE_LUA = """
if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) end
return 0
"""


def lease_ms() -> int:
    """``LEASE_SECONDS`` in milliseconds (read at each use: tests may shorten it)."""
    return int(LEASE_SECONDS * 1000)


def lease(store: Any, key: str, holder: str, ttl: int) -> bool | None:
    """Take or renew the lease on attempt ``key`` for delivery ``holder``, for ``ttl`` ms.

    ``True``: ``holder`` holds it now; ``False``: another delivery does; ``None``:
    the store keeps no leases (it has no ``lease`` method, or it returns ``None``).
    """
    method = getattr(store, "lease", None)
    taken = None if method is None else method(key, holder, ttl)
    return None if taken is None else bool(taken)


class LeaseRenewer:
    """Renews the leases of the deliveries this process works on.

    A registry by construction: ``hold`` adds one, ``drop`` stops renewing it.
    The thread starts on first use (again in a forked child).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, tuple[Any, str]] = {}  # holder -> (store, attempt key)
        self._renewed: dict[str, float] = {}  # holder -> time.monotonic() of its last take
        #: Leases a renewal took again after their delivery gave them up (given back at the
        #: next beat, once the release that crossed it has surely landed).
        self._late: list[tuple[Any, str, str]] = []
        self._by_thread: dict[int, str] = {}  # the holder each thread renews, its latest
        self._pid = 0

    def hold(self, store: Any, key: str, holder: str) -> None:
        """Renew ``holder``'s lease on ``key`` in ``store`` until ``drop(holder)``; it was
        just taken. A thread works on one delivery at a time: the lease it held before,
        if nothing dropped it (an exception in the wrong place), is renewed no more."""
        with self._lock:
            before = self._by_thread.get(threading.get_ident())
            if before is not None and before != holder:
                self._forget(before)
            self._by_thread[threading.get_ident()] = holder
            self._held[holder] = (store, key)
            self._renewed[holder] = time.monotonic()
            if self._pid != os.getpid():
                self._pid = os.getpid()
                threading.Thread(target=self._run, daemon=True, name="ojs-lease").start()

    def drop(self, holder: str) -> None:
        """Stop renewing ``holder``'s lease: it lapses after ``LEASE_SECONDS``."""
        with self._lock:
            self._forget(holder)
            if self._by_thread.get(threading.get_ident()) == holder:
                del self._by_thread[threading.get_ident()]

    def _forget(self, holder: str) -> None:
        """Renew ``holder``'s lease no more (the lock held)."""
        self._held.pop(holder, None)
        self._renewed.pop(holder, None)

    def alive(self, holder: str) -> bool:
        """Whether ``holder`` surely still holds its lease: taken or renewed less than
        ``LEASE_SECONDS - BEAT_SECONDS`` ago, and never found taken by another delivery."""
        with self._lock:
            renewed = self._renewed.get(holder)
        return renewed is not None and time.monotonic() - renewed < LEASE_SECONDS - BEAT_SECONDS

    def beat(self) -> None:
        """Renew every held lease once; a store error is logged and tried at the next beat."""
        with self._lock:
            held, late, self._late = list(self._held.items()), self._late, []
        for store, key, holder in late:
            _give_up(store, key, holder)
        for holder, (store, key) in held:
            try:
                began = time.monotonic()
                taken = lease(store, key, holder, lease_ms())
                if taken is False:
                    logger.warning("The lease on attempt %s lapsed and another delivery "
                                   "took it.", key)
                    self.drop(holder)
                elif taken:
                    with self._lock:
                        if holder in self._renewed:
                            self._renewed[holder] = began
                        else:  # given up while this renewal was on its way: it may have
                            self._late.append((store, key, holder))  # taken it again
            except Exception:
                logger.info("Could not renew the lease on attempt %s.", key, exc_info=True)

    def _run(self) -> None:
        while True:
            time.sleep(BEAT_SECONDS)
            self.beat()


def release(heartbeat: LeaseRenewer, store: Any, key: str, holder: str) -> None:
    """Stop renewing ``holder``'s lease on ``key`` and give it up now (if it still holds
    it), so the next delivery need not wait for it to lapse; only the drop for stores
    without ``release_lease``, and a store error is logged (the lease then lapses)."""
    heartbeat.drop(holder)
    _give_up(store, key, holder)


def _give_up(store: Any, key: str, holder: str) -> None:
    method = getattr(store, "release_lease", None)
    if method is None or not holder:
        return
    try:
        method(key, holder)
    except Exception:
        logger.info("Could not release the lease on attempt %s; it lapses.", key, exc_info=True)
