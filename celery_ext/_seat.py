"""A Celery delivery's hold on its attempt: lease, claim and record calls.

``AttemptSeat`` is the ``Seat`` that ``ojs_adapters.runtime.admission.admit`` takes,
and it stores the attempt's records: the last save of a delivery gives its lease up in
the same round trip, riding in Celery's own result write when it can (``_result_ride``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from functools import partial
from typing import Any, NoReturn

from celery.exceptions import Reject

from celery_ext._handoff import (
    TOKEN_HEADER,
    claim_key,
    new_token,
    replaced_round,
    replay_round,
    with_retry,
)
from celery_ext._headers import HeaderState
from celery_ext._result_ride import meta_key, peek
from celery_ext.records import RecordStore
from ojs_adapters import JobRecord
from ojs_adapters.runtime.admission import wait_limit
from ojs_adapters.runtime.backend_retry import count_failure
from ojs_adapters.runtime.claims import AdmissionReply
from ojs_adapters.runtime.handoff import Claim
from ojs_adapters.runtime.leases import LeaseRenewer, lease, release

logger = logging.getLogger("celery_ext")


def ended_by(raised: BaseException) -> str:
    """The record's ``end_reason`` of a job its handler ended with ``raised``.

    >>> from celery.exceptions import Ignore
    >>> ended_by(Ignore()), ended_by(Reject("bad", requeue=False))
    ('ended by the handler (Ignore)', 'ended by the handler (Reject)')
    """
    return f"ended by the handler ({type(raised).__name__})"


def ended_record(fresh: JobRecord, raised: BaseException) -> JobRecord:
    """The record of a job whose handler ended it with ``raised`` (``fresh``: the attempt's
    ``active`` record): discarded, saying why."""
    return replace(fresh.started(fresh.attempt), state="discarded", outcome="discarded",
                   extra={**fresh.extra, "end_reason": ended_by(raised)})


#: Renews the leases of the Celery deliveries this process runs (a registry; not
#: ``_heartbeat``, which keeps Redis deliveries reserved).
LEASES = LeaseRenewer()


class AttemptSeat:
    """One delivery's store calls, lease and give-back (``Reject(requeue=True)``)."""

    def __init__(self, task: Any) -> None:
        self.task = task
        self.request = task.request
        self.state = HeaderState.from_headers(self.request.headers)
        self.store = RecordStore(task.backend)
        self.nonce = new_token()  # this delivery
        self.attempt = self.state.attempt
        self.rounds = (replaced_round(self.request.replaced_task_nesting),
                       replay_round(self.request.headers))
        self.label = f"{task.name}[{self.request.id}]"
        self.logger = logger
        self.holder = ""  # this delivery's lease holder, once it took the lease
        self.released = False  # given up with the outcome's save (one round trip)
        self.replaced = False  # the job went on as a ``Task.replace`` replacement (_replace)
        self.started = time.monotonic()

    def deadline(self) -> float:
        """Past it, an admission wait gives the delivery back (a Celery limit cannot pause);
        asked only when a delivery waits (the limits are read from the app's settings)."""
        return self.started + wait_limit(self._time_limit())

    def begin(self, fresh: JobRecord | None, lease_ms: int | None) -> AdmissionReply | None:
        assert fresh is not None  # a Celery attempt always writes its ``active`` record
        # The task's result meta is read in the same call: Celery reads it again before it
        # stores the outcome, and ``_result_ride.peek`` answers that read (no round trip).
        meta = meta_key(self.task.backend, self.request.id)
        reply: AdmissionReply | None = with_retry(self.task.app, lambda: self.store.begin(
            self.claim_key(), self.token(), fresh, rounds=self.rounds, lease_ms=lease_ms,
            peek=meta),
            operation="claim attempt")
        if reply is not None and meta is not None and reply.leased:
            peek(meta, reply.peeked)
        return reply

    def lease(self, ttl_ms: int) -> bool | None:
        return with_retry(self.task.app, lambda: lease(self.store, self.claim_key(),
                                                       self.token(), ttl_ms),
                          operation="lease attempt")

    def load(self) -> JobRecord | None:
        return with_retry(self.task.app, lambda: self.store.load(self.request.id),
                          operation="read job record")

    def claim(self) -> Claim:
        return with_retry(self.task.app, lambda: self.store.claim(self.claim_key(),
                                                                  self.token()),
                          operation="claim attempt")

    def hold_lease(self) -> None:
        """Keep this delivery's lease renewed until the outcome is stored."""
        self.holder = self.token()
        LEASES.hold(self.store, self.claim_key(), self.holder)

    def waiting(self) -> AbstractContextManager[None]:
        return nullcontext()

    def give_back(self, why: str) -> NoReturn:
        raise Reject(why, requeue=True)

    def lease_alive(self) -> bool:
        """Whether this delivery surely still holds its attempt's lease: then no other
        delivery can have written the task's result meta since admission read it."""
        return bool(self.holder) and LEASES.alive(self.holder)

    def release_lease(self) -> None:
        """Stop renewing the lease and give it up, unless the last save does (renewals
        then stop once that save is done: ``save``)."""
        if not self.released:
            release(LEASES, self.store, self.claim_key(), self.holder)

    def _time_limit(self) -> float | None:
        """The shortest time limit (hard or soft, seconds) this delivery runs under."""
        hard, soft = self.request.timelimit or (None, None)
        conf = self.task.app.conf
        limits = [float(x) for x in (hard or self.task.time_limit or conf.task_time_limit,
                                     soft or self.task.soft_time_limit
                                     or conf.task_soft_time_limit) if x]
        return min(limits) if limits else None

    def token(self) -> str:
        """``<copy token>|<delivery nonce>``: a retried claim whose reply was lost stays ours."""
        copy = str((self.request.headers or {}).get(TOKEN_HEADER) or "sent")
        return f"{copy}|{self.nonce}"

    def claim_key(self) -> str:
        """``<task id>:<attempt>``, plus the round: a replayed dead letter, a replacement."""
        replaced, replays = self.rounds
        return claim_key(self.request.id, self.state.attempt, replays=replays,
                         replaced=replaced)

    # -- the record -----------------------------------------------------------------

    def save(self, record: JobRecord, *, force: bool = False, last: bool = False) -> None:
        """Store ``record``; a write that fails even after its retries is logged and counted.

        A stored record of a later attempt is kept unless ``force`` (``RecordStore.save``).
        ``last``: the delivery's outcome, which gives up its lease in the same round trip.
        """
        release = (self.claim_key(), self.holder) if last and self.holder else None
        # Renewals stop once the save that releases the lease is done: until then a
        # redelivery must find the lease held, not an attempt it would take as lost. A
        # renewal that crosses the release takes the lease again for a moment; the renewer
        # gives it back at its next beat (``LeaseRenewer.beat``).
        stop = partial(LEASES.drop, self.holder) if release is not None else None
        # The outcome rides in the MULTI of Celery's own result write, which follows in
        # this thread before the ack (``_result_ride``; saved alone if that write does not
        # come): no round trip of its own.
        if last and not force and self.store.save_with_result(
                record, release, lambda: self._save_now(record, force, release), stop):
            self.released = release is not None
            return
        try:
            self._save_now(record, force, release)
        finally:
            if stop is not None:
                stop()

    def _save_now(self, record: JobRecord, force: bool,
                  release: tuple[str, str] | None) -> None:
        try:
            if with_retry(self.task.app,
                          lambda: self.store.save(record, force=force, release=release),
                          operation="write job record"):
                self.released = True
        except Exception:  # never fail the job for its record
            count_failure("write job record", "failed")
            logger.warning("%s[%s]: cannot store the job record", self.task.name,
                           self.request.id, exc_info=True)

    def handler_ended(self, raised: BaseException, fresh: JobRecord,
                      before: Callable[[], JobRecord | None]) -> None:
        """After the handler's own ``Ignore`` or ``Reject``, not OJS failures: a requeued
        delivery starts the attempt afresh (record and claim as ``before()`` it); a job the
        handler ended (``Ignore``, ``Reject(requeue=False)``) is discarded, saying so; a
        replaced one goes on as its replacement (``_replace``)."""
        if self.replaced:
            return
        if isinstance(raised, Reject) and raised.requeue:
            self.restore(before())
            return
        self.save(ended_record(fresh, raised))

    def restore(self, record: JobRecord | None) -> None:
        """Put back the record and the claim as before this attempt (no record: remove it)."""
        try:
            self.store.release(self.claim_key())
        except Exception:
            logger.warning("%s[%s]: cannot release the claim", self.task.name,
                           self.request.id, exc_info=True)
        if record is not None:
            self.save(record, force=True)  # an earlier attempt's record over this one's
            return
        try:
            self.store.delete(self.request.id)
        except Exception:
            logger.warning("%s[%s]: cannot remove the job record", self.task.name,
                           self.request.id, exc_info=True)
