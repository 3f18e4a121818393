"""Attempt leases: a second delivery of an attempt waits while the first one is alive.

Dramatiq can hand a message out again while its first delivery is still at work:
RabbitMQ gives back every unacked message as soon as a consumer's connection
drops (the worker goes on with it, and holds its ack while a successor or a record
cannot be written), a delay-queue message whose ack was lost is forwarded twice,
and Redis queue maintenance re-pushes the unacked messages of a worker it takes
for dead. That copy is the same copy (same token, claim ``"mine"``) and the record
shows its attempt ``active``, exactly what a redelivery after a crash looks like:
judged alone, it would record a lost attempt (a phantom ``HANDLER_PANIC``, RET-12)
while the first delivery completes, or publish a second successor.

So every delivery of an attempt first takes a *lease* on it in the record store
(``stores.lease``, keyed like the claim, held by ``<token>|<nonce>``), renewed by
``HEARTBEAT``: one daemon thread per process, every ``BEAT_SECONDS``. A delivery
that finds another one's lease alive waits (unacked, nothing run) until it can take
it; only then does it claim and read the record, alone on that attempt. Once the
attempt's outcome is stored and its successor accepted (``before_ack``), the lease
is no longer renewed and lapses after ``LEASE_SECONDS``; the waiting copy, which
re-reads the record meanwhile, finds that outcome at once and is dropped as a
duplicate. If the holder died, its lease lapses, and the waiting copy is then
judged as a redelivery after a crash.
Taking the lease before the claim matters: a copy that judged first and leased
after could find the record not yet marked ``active`` and count the attempt lost
while its twin had just claimed it. This is the heartbeat of ojs-retry.md section
9.3 (RET-13), for redeliveries.

Limits: the lease says that the holding *process* is alive, not that the job
makes progress (a hung actor keeps its attempt; bound it with a time limit); and a
store out of reach for longer than ``LEASE_SECONDS - BEAT_SECONDS`` lets a live
lease lapse, after which a redelivery is judged without it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from dramatiq.broker import Broker, MessageProxy
from dramatiq.middleware import TimeLimit

from dramatiq_ext.stores import lease

logger = logging.getLogger(__name__)

#: How long a lease outlives its last renewal, in seconds: how long a redelivery after
#: a crash waits before it counts the lost attempt.
LEASE_SECONDS = 6.0
#: How often ``HEARTBEAT`` renews the leases it holds, in seconds: a store outage of up to
#: ``LEASE_SECONDS - BEAT_SECONDS`` (5 s) leaves a live lease alive.
BEAT_SECONDS = 1.0
#: How often a delivery waiting for another one's lease looks again, in seconds.
WAIT_SECONDS = 0.5


def lease_ms() -> int:
    """``LEASE_SECONDS`` in milliseconds (read at each use: tests may shorten it)."""
    return int(LEASE_SECONDS * 1000)


class Heartbeat:
    """Renews the leases of the deliveries this process works on.

    A registry by construction: ``hold`` adds one, ``drop`` stops renewing it.
    The thread starts on first use (again in a forked child).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, tuple[Any, str]] = {}  # holder -> (store, attempt key)
        self._pid = 0

    def hold(self, store: Any, key: str, holder: str) -> None:
        """Renew ``holder``'s lease on ``key`` in ``store`` until ``drop(holder)``."""
        with self._lock:
            self._held[holder] = (store, key)
            if self._pid != os.getpid():
                self._pid = os.getpid()
                threading.Thread(target=self._run, daemon=True, name="ojs-lease").start()

    def drop(self, holder: str) -> None:
        """Stop renewing ``holder``'s lease: it lapses after ``LEASE_SECONDS``."""
        with self._lock:
            self._held.pop(holder, None)

    def beat(self) -> None:
        """Renew every held lease once; a store error is logged and tried at the next beat."""
        with self._lock:
            held = list(self._held.items())
        for holder, (store, key) in held:
            try:
                if lease(store, key, holder, lease_ms()) is False:
                    logger.warning("The lease on attempt %s lapsed and another delivery "
                                   "took it.", key)
                    self.drop(holder)
            except Exception:
                logger.info("Could not renew the lease on attempt %s.", key, exc_info=True)

    def _run(self) -> None:
        while True:
            time.sleep(BEAT_SECONDS)
            self.beat()


#: The process's heartbeat.
HEARTBEAT = Heartbeat()


@contextmanager
def time_limit_paused(broker: Broker, message: MessageProxy) -> Iterator[None]:
    """Dramatiq's ``TimeLimit`` stopped for this thread while the adapter waits, then
    started afresh: a wait for another delivery is no part of the actor's run (its time
    limit would otherwise end the attempt as ``HANDLER_TIMEOUT`` before it began)."""
    limits = [m for m in broker.middleware if isinstance(m, TimeLimit)]
    for limit in limits:
        limit.after_process_message(broker, message)  # type: ignore[no-untyped-call]
    try:
        yield
    finally:
        for limit in limits:
            limit.before_process_message(broker, message)  # type: ignore[no-untyped-call]
