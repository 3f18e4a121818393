"""Admission: the lease, the claim and the record's verdict before an attempt runs.

Both adapters admit a delivery with ``admit``; they differ only in their ``Seat``
(how to reach the store, wait, and give the delivery back to their broker). The rule:
nothing runs without its lease and its claim. A delivery that cannot have them at once
(another live delivery holds the lease, the store is out of reach) waits unrun, at most
``CLAIM_WAIT_SECONDS`` and never past its time limit less ``LIMIT_MARGIN``, then is given
back to the broker unrun. The record and the claim then say what the delivery is
(``handoff.judge_delivery``). docs/lifecycle.md has the reasoning.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import NamedTuple, NoReturn, Protocol, TypeVar

from ojs_adapters.history import JobRecord
from ojs_adapters.runtime.backend_retry import count_failure
from ojs_adapters.runtime.claims import AdmissionReply, record_of
from ojs_adapters.runtime.handoff import Claim, Verdict, judge_delivery
from ojs_adapters.runtime.leases import WAIT_SECONDS, lease_ms

#: Seconds a delivery waits, nothing run, for another live delivery of its attempt or for an
#: unreachable store before it is given back to the broker (read at each use: tests shorten it).
CLAIM_WAIT_SECONDS = 60.0
#: Seconds of a time limit a waiting delivery leaves unused.
LIMIT_MARGIN = 0.5

_T = TypeVar("_T")


class Seat(Protocol):
    """One delivery as admission sees it; each adapter supplies its own.

    The store calls retry in place and raise when the store stays out of reach.
    """

    attempt: int
    rounds: tuple[int, int]  # its replacement and replay rounds (``handoff.record_rank``)
    label: str  # "<task>[<job id>]", for the log lines
    logger: logging.Logger

    def begin(self, fresh: JobRecord | None, lease_ms: int | None) -> AdmissionReply | None:
        """Lease (with ``lease_ms``), claim, read and maybe write ``fresh``, in one call;
        ``None`` where the store cannot do that in one."""

    def lease(self, ttl_ms: int) -> bool | None:
        """Take or renew this delivery's lease (``None``: the store keeps none)."""

    def load(self) -> JobRecord | None:
        """The stored record of the job."""

    def claim(self) -> Claim:
        """This copy's claim on its attempt."""

    def hold_lease(self) -> None:
        """Keep the lease renewed until the outcome is stored."""

    def waiting(self) -> AbstractContextManager[None]:
        """Around the waits (Dramatiq holds its time limit meanwhile)."""

    def give_back(self, why: str) -> NoReturn:
        """Hand the delivery back to the broker unrun, and leave the hook."""


class Admission(NamedTuple):
    """What admission found: the verdict, the record as stored before this delivery, and
    whether the ``active`` record (``fresh``) was written with the claim.

    When it was, the verdict is "run" and the stored record is not parsed (``record`` is
    ``None``): ``stored()`` parses it from ``raw`` for the rare caller that needs it.
    """

    verdict: Verdict
    record: JobRecord | None
    wrote: bool
    raw: bytes | str | None = None

    def stored(self) -> JobRecord | None:
        """The record as stored before this delivery."""
        return self.record if self.raw is None else record_of(self.raw)


def wait_limit(time_limit: float | None) -> float:
    """Seconds a delivery may wait unrun: ``CLAIM_WAIT_SECONDS``, and less than its limit."""
    if time_limit is None:
        return CLAIM_WAIT_SECONDS
    return min(CLAIM_WAIT_SECONDS, time_limit - LIMIT_MARGIN)


def admit(seat: Seat, fresh: JobRecord | None, *, deadline: Callable[[], float]) -> Admission:
    """Lease, claim and judge one delivery; ``fresh`` is its ``active`` record, written with
    a new claim over no record or an earlier attempt's. Past ``deadline()``
    (``time.monotonic()``; asked only if the delivery waits), a delivery still waiting is
    given back (``Seat.give_back``)."""
    begun = _begin(seat, fresh, lease_ms())  # the usual case: one round trip in all
    if begun is None or not begun.leased:
        with seat.waiting():
            waits = _Waits(seat, deadline())
            _take_lease(seat, waits)
            begun = _begin(seat, fresh, None)
            if begun is None:  # no one-call store, or out of reach: one call each
                # A record that cannot be read is not a missing one: judged as missing, a
                # copy's own redelivery ("mine") would count its finished attempt lost.
                record = waits.until(seat.load, "the job record cannot be read")
                claimed = waits.until(seat.claim, "the job store is out of reach")
                # our own start, by a ``begin`` whose replies were all lost: not a crash
                own = claimed == "new" and record is not None and record == fresh
                record = None if own else record
                return Admission(judge_delivery(record, seat.attempt, claim=claimed,
                                                rounds=seat.rounds),
                                 record, own)
    else:
        seat.hold_lease()
    if begun.wrote and begun.claim == "new":  # over no record or an earlier attempt's: run
        return Admission("run", None, True, begun.record)
    record = record_of(begun.record)
    return Admission(judge_delivery(record, seat.attempt, claim=begun.claim,
                                     rounds=seat.rounds), record, False)


def read_record(seat: Seat) -> JobRecord | None:
    """The stored record, or ``None`` (logged, counted) if it cannot be read: an aid only."""
    try:
        return seat.load()
    except Exception:
        count_failure("read job record", "failed")
        seat.logger.warning("%s: cannot read the job record", seat.label, exc_info=True)
        return None


def _begin(seat: Seat, fresh: JobRecord | None, lease: int | None) -> AdmissionReply | None:
    try:
        return seat.begin(fresh, lease)
    except Exception:  # the step-by-step path waits for the store
        return None


def _take_lease(seat: Seat, waits: _Waits) -> None:
    """This delivery's lease, waiting while another live delivery holds it (RabbitMQ hands
    a running message out again when its connection drops: judged at once, it would look
    like a crash). Returns without it once the record shows the attempt over (this delivery
    is then a duplicate), or at once if the store keeps no leases."""
    while True:
        try:
            taken = seat.lease(lease_ms())
        except Exception:
            waits.wait("the job store is out of reach")
            continue
        if taken is None:
            return  # a store that keeps no leases (said at worker start)
        if taken:
            seat.hold_lease()
            return
        if judge_delivery(read_record(seat), seat.attempt, claim="mine",
                          rounds=seat.rounds) == "duplicate":
            return  # the holder's outcome is stored (it gives its lease up)
        waits.wait(f"another delivery of attempt {seat.attempt} is alive")


class _Waits:
    """The bounded wait of one delivery: said once, given back past the deadline."""

    def __init__(self, seat: Seat, deadline: float) -> None:
        self.seat, self.deadline, self.said = seat, deadline, False

    def wait(self, why: str) -> None:
        """Sleep ``WAIT_SECONDS``, or give the delivery back if that passes the deadline."""
        seat = self.seat
        if time.monotonic() + WAIT_SECONDS > self.deadline:
            seat.logger.warning("%s: attempt %d not run: %s; given back to the broker",
                                seat.label, seat.attempt, why)
            seat.give_back(why)
        if not self.said:
            self.said = True
            seat.logger.warning("%s: attempt %d waits, not run: %s", seat.label, seat.attempt,
                                why)
        time.sleep(WAIT_SECONDS)

    def until(self, call: Callable[[], _T], why: str) -> _T:
        """``call()``, waiting while it raises (the store is out of reach)."""
        while True:
            try:
                return call()
            except Exception:
                self.wait(why)
