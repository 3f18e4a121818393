"""One delivery of an ``OjsTask`` in the worker: run the attempt, execute the decision.

This module translates Celery events into ``decide()`` inputs and carries out
the ``Decision``; it makes no choice of its own.

- The attempt number and history come from the message header (``_headers``).
- Before the body runs, the job record says whether this delivery repeats an
  attempt that already started: Celery redelivers a byte-identical message
  after a lost worker (``WorkerLostError`` with ``acks_late`` and
  ``reject_on_worker_lost``, or a SIGKILLed worker whose unacked message the
  broker gives back), and ``Request.on_failure`` never calls ``Task.on_failure``
  on that path. A record still ``active`` at this attempt means the previous
  delivery died: that consumes the attempt as ``HANDLER_PANIC`` (or
  ``HANDLER_TIMEOUT`` if ``OjsRequest`` marked a hard time limit) via
  ``decide(policy, n, Failure.worker_lost())`` (RET-12), and the body does
  not run again before the countdown.
- ``retry`` is a native ``Task.retry`` with the exact float countdown and the
  history merged into the request's headers; Celery keeps queue, routing key
  and priority (``signature_from_request``). ``max_retries`` is the policy's,
  so Celery's own limit never cuts in first (RET-01). A countdown of more than
  ``ojs_park_after`` s (default 60) is *parked* on the broker until it is due
  instead of waiting in a worker's memory (``_parking``, issue 8).
- ``discard``/``fail`` raise ``JobDiscarded`` and ``dead_letter`` raises
  ``JobDeadLettered``: the trace stores FAILURE (so ``AsyncResult.get()``
  raises at once) and ``OjsRequest`` publishes the dead letter before the ack.
- **Safe hand-off** (issue 11). The retry is published through a confirming
  connection with a fresh ``ojs-token`` header and the ``x-ojs-*`` error headers
  (``_handoff``), tried in place on backend errors (5 tries from 100 ms); the
  record is then marked ``handed_off`` (unless the retry already ran: saves are
  ordered, ``records``), and only after that does ``Task.retry``'s
  ``Retry`` reach the trace, which acks. If the broker does not accept it, the
  original is requeued (``Reject(requeue=True)``; with the broker gone it simply
  stays unacked and the broker gives it back). A retry that cannot be published for
  a reason other than the broker (kombu cannot encode it, a router raises) is decided
  again: the job is dead-lettered with a history entry naming why
  (``_handoff.unpublishable``), saved and reported; only that decision is reported.
  A delivery is judged by
  ``ojs_adapters.handoff.judge_delivery``: each copy first *claims* its attempt
  (``RecordStore.claim``); a copy that lost the claim, or whose attempt the record
  shows finished and handed off, is dropped (``Ignore``); a redelivered original
  whose retry is not marked as handed off publishes it again. Before it judges,
  a delivery takes a lease on its attempt (``ojs_adapters.leases``, renewed every
  second while it runs): a second delivery of a live attempt (RabbitMQ gives back
  a running message when the consumer's connection drops; on Redis the visibility
  heartbeat puts back the deliveries of a closed channel) waits for it instead of
  counting a lost worker, and is dropped once the outcome is stored (the lease is
  then released). A crashed worker's lease lapses after 6 s; then the redelivery
  counts the lost attempt.
- **Admission waits are bounded** (the same rule as ``dramatiq_ext``): nothing runs
  without its lease and its claim. A delivery waits, nothing run, while another live
  delivery holds the lease or while the store is out of reach, at most
  ``CLAIM_WAIT_SECONDS`` and never past its shortest time limit less ``LIMIT_MARGIN``
  (a Celery limit counts from the start of the delivery and cannot be paused: one that
  fired during the wait would be taken for the attempt's own); then it is given back to
  the broker unrun (``Reject(requeue=True)``, logged with the task name) and tries again
  on its next delivery.
- **Extensions** (issue 10): the job's idempotency key (``ojs`` header, else the
  task id) goes into the record and every retry's header, and ``self.ojs`` shows
  it to the body; a task naming a ``retry_budget`` counts each attempt that runs
  as an execution of that dependency and lets the budget veto a retry (R-7);
  ``first_attempt_at`` and the previous countdown feed ``max_duration`` and
  decorrelated jitter.
- Each decision carried out is reported once to the core's hooks
  (``ojs_adapters.emit``: the decision log, metrics); a resent retry or a
  redone dead letter is the same decision and is not reported again.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import Any, NoReturn

from billiard.exceptions import WorkerLostError
from celery import Task
from celery.exceptions import Ignore, Reject, Retry, SoftTimeLimitExceeded, TimeLimitExceeded

from celery_ext._budgets import budget_of
from celery_ext._handoff import (
    NOT_THE_BROKER,
    TOKEN_HEADER,
    Unpublishable,
    confirming_connection,
    new_token,
    replay_round,
    unpublishable,
    with_retry,
)
from celery_ext._headers import HEADER, HeaderState, merged
from celery_ext._parking import parking_producer
from celery_ext._routing import dead_letter_queue_for, queue_of
from celery_ext.dlq import replay_info
from celery_ext.exceptions import JobDeadLettered, JobDiscarded
from celery_ext.records import RecordStore
from ojs_adapters import (
    Decision,
    DecisionEvent,
    Failure,
    JobContext,
    JobRecord,
    OjsValidationError,
    RetryPolicy,
    decide,
    describe_failure,
    emit,
)
from ojs_adapters.backend_retry import count_failure
from ojs_adapters.claims import Begun, record_of
from ojs_adapters.errors import OjsBackendError
from ojs_adapters.failure import requested_retry
from ojs_adapters.handoff import Claim, attempt_id, error_headers, handed_off, judge_delivery
from ojs_adapters.leases import WAIT_SECONDS, Heartbeat, lease, lease_ms, release

logger = logging.getLogger("celery_ext")

#: App setting: a zero-argument callable returning the jitter sample u in [0, 1).
JITTER_SETTING = "ojs_jitter_source"
#: Header naming the catalog code of the last failure (ojs-errors.md ERR-008).
ERROR_CODE_HEADER = "x-ojs-error-code"
#: Attribute of the task request holding the running attempt's ``JobContext``.
CONTEXT_ATTRIBUTE = "ojs_context"
#: Seconds of a time limit a waiting delivery leaves unused.
LIMIT_MARGIN = 0.5
#: Seconds a delivery waits, nothing run, for another live delivery of its attempt or for an
#: unreachable store before it is given back to the broker (read at each use: tests shorten it).
CLAIM_WAIT_SECONDS = 60.0
#: Renews the leases of the Celery deliveries this process runs (a registry; not
#: ``_heartbeat``, which keeps Redis deliveries reserved).
LEASES = Heartbeat()


class RetryRequested(Exception):
    """Raised by ``OjsTask.retry``: the handler asks for a retry; the policy decides."""

    def __init__(self, exc: BaseException | None, countdown: float | None) -> None:
        super().__init__(exc, countdown)
        self.exc = exc
        self.countdown = countdown


def run_attempt(task: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run one delivery of ``task`` in the worker and act on how it ends."""
    run = _Run(task)
    if run.state.invalid is not None:  # unreadable OJS state: dead-letter it unrun (_headers)
        run.fail(run.state.invalid, None)
    # Lease, claim, record read and ``active`` write: one round trip (ojs_adapters.claims);
    # alone on the attempt from here (ojs_adapters.leases).
    begun = run.admit()
    try:
        previous = run.check_redelivery(begun)
        run.wait_for_countdown()
        if not run.started_saved:
            run.save(run.base.started(run.state.attempt))
        run.start()
        try:
            result = task.run(*args, **kwargs)
        except (Ignore, Reject):
            # Celery control flow the handler chose, not an OJS failure: undo "active", so
            # a requeued delivery starts this attempt afresh instead of counting as a crash.
            run.restore(previous)
            raise
        except RetryRequested as request:
            run.fail(_requested_failure(request), request.exc)
        except (SoftTimeLimitExceeded, TimeLimitExceeded) as exc:
            run.fail(describe_failure(exc, catalog_code="HANDLER_TIMEOUT"), exc)
        except Exception as exc:
            run.fail(exc, exc)
        run.save(run.base.started(run.state.attempt).completed(), last=True)
        return result
    finally:
        # The outcome is stored: the next delivery (a requeue after a failed hand-off,
        # say) need not wait for the lease to lapse. Usually the last save released it.
        run.release_lease()


class _Run:
    """The state of one delivery: header state, policy, record store."""

    def __init__(self, task: Any) -> None:
        self.task = task
        self.request = task.request
        self.state = HeaderState.from_headers(self.request.headers)
        self.policy: RetryPolicy = _header_policy(task, self.state)
        self.store = RecordStore(task.backend)
        self.nonce = new_token()  # this delivery
        self.queue = queue_of(task.app, self.request.delivery_info)
        self.first_attempt_at = self.state.first_attempt_at or time.time()
        # A message sent without OjsTask.apply_async (send_task) has no key: the task id,
        # which its retries and replays keep, serves as one.
        self.key = self.state.idempotency_key or str(self.request.id)
        self.dependency: str | None = getattr(type(task), "retry_budget", None)
        self.started_saved = False  # ``begin`` wrote the ``active`` record with the claim
        self.started_record: JobRecord | None = None  # what ``begin`` tried to write
        self.holder = ""  # this delivery's lease holder, once it took the lease
        self.waited = False  # said once that this delivery waits
        limit = self._time_limit()
        wait = CLAIM_WAIT_SECONDS if limit is None else min(CLAIM_WAIT_SECONDS,
                                                            limit - LIMIT_MARGIN)
        self.deadline = time.monotonic() + wait  # past it, an admission wait gives up
        self.released = False  # given up with the outcome's save (one round trip)
        self.base = JobRecord(
            id=self.request.id, type=task.name, queue=self.queue,
            max_attempts=self.policy.max_attempts, errors=self.state.errors,
            extra={"countdowns": list(self.state.countdowns),
                   "jitter_samples": list(self.state.jitter_samples),
                   "retry_policy": self.policy.to_dict(),
                   "idempotency_key": self.key,
                   **replay_info(self.request.headers)},  # a replayed dead letter's count
        )

    # -- before the body ------------------------------------------------------------

    def start(self) -> None:
        """The attempt runs: show its context to the body, count it against its budget."""
        setattr(self.request, CONTEXT_ATTRIBUTE, JobContext(
            job_id=str(self.request.id), attempt=self.state.attempt, idempotency_key=self.key,
            errors=self.state.errors,
            replay_count=int(self.base.extra.get("replay_count") or 0)))
        if self.dependency is not None:
            budget_of(self.task.app, self.dependency).record_execution()

    def admit(self) -> Begun | None:
        """Take the lease and begin the attempt in one store call; ``None`` when that
        cannot be done at once: another live delivery holds the lease (``lease_attempt``
        waits for it), or the store has no one-call admission or is out of reach (then
        ``check_redelivery`` goes step by step)."""
        begun = self.begin(lease=True)
        if begun is not None and begun.leased:
            self.hold_lease(self.token())
            return begun
        self.lease_attempt()
        return None

    def hold_lease(self, holder: str) -> None:
        """Keep this delivery's lease renewed until the outcome is stored."""
        LEASES.hold(self.store, self.claim_key(), holder)
        self.holder = holder

    def release_lease(self) -> None:
        """Stop renewing the lease, and give it up unless the last save already did."""
        if self.released:
            LEASES.drop(self.holder)
        else:
            release(LEASES, self.store, self.claim_key(), self.holder)

    def lease_attempt(self) -> None:
        """Take this delivery's lease on its attempt (``ojs_adapters.leases``), waiting,
        nothing run, while another live delivery holds it (RabbitMQ hands a running
        message out again when the consumer's connection drops, and judged at once it
        would look like a crash) or while the store is out of reach. Returns without the
        lease once the record shows the attempt over (this delivery is then a duplicate),
        or if the store keeps none; gives the delivery back (``give_back_or_wait``)
        rather than wait past ``deadline``."""
        key, holder = self.claim_key(), self.token()
        while True:
            try:
                taken: bool | None = with_retry(
                    self.task.app, lambda: lease(self.store, key, holder, lease_ms()),
                    operation="lease attempt")
            except Exception:
                self.give_back_or_wait("the job store is out of reach")
                continue
            if taken is None:
                return  # a backend that keeps no leases (said at worker start)
            if taken:
                self.hold_lease(holder)
                return
            if judge_delivery(self.load(), self.state.attempt, claim="mine") == "duplicate":
                return  # the holder's outcome is stored (it releases its lease)
            self.give_back_or_wait(f"another delivery of attempt {self.state.attempt} "
                                   "is alive")

    def give_back_or_wait(self, why: str) -> None:
        """Wait ``WAIT_SECONDS`` more, nothing run, or give the delivery back to the broker
        unrun (``Reject(requeue=True)``) if that would pass ``deadline``."""
        if time.monotonic() + WAIT_SECONDS > self.deadline:
            logger.warning("%s[%s]: attempt %d not run: %s; given back to the broker",
                           self.task.name, self.request.id, self.state.attempt, why)
            raise Reject(why, requeue=True)
        if not self.waited:
            self.waited = True
            logger.warning("%s[%s]: attempt %d waits, not run: %s", self.task.name,
                           self.request.id, self.state.attempt, why)
        time.sleep(WAIT_SECONDS)

    def _time_limit(self) -> float | None:
        """The shortest time limit (hard or soft, seconds) this delivery runs under."""
        hard, soft = self.request.timelimit or (None, None)
        conf = self.task.app.conf
        limits = [float(x) for x in (hard or self.task.time_limit or conf.task_time_limit,
                                     soft or self.task.soft_time_limit
                                     or conf.task_soft_time_limit) if x]
        return min(limits) if limits else None

    def check_redelivery(self, begun: Begun | None) -> JobRecord | None:
        """Act on a delivery that repeats an attempt the record already knows about.

        ``begun`` is what ``admit`` found, if it began the attempt. Returns the stored
        record when this is a new attempt (the normal case).
        """
        attempt = self.state.attempt
        if begun is None:
            begun = self.begin()
        if begun is None:  # not the Redis backend, or unreachable: one call each
            # A record that cannot be read is not a missing one: judged as missing, a
            # copy's own redelivery ("mine") would count its finished attempt lost.
            record = self.load_for_admission()
            claimed = self.claim()
            if claimed == "new" and record is not None and record == self.started_record:
                # our own start, by a ``begin`` whose replies were all lost: not a crash
                record, self.started_saved = None, True
        else:
            claimed, raw, self.started_saved = begun[:3]
            record = record_of(raw)
        verdict = judge_delivery(record, attempt, claim=claimed)
        if verdict == "run":
            return record
        # "lost" without a record: this copy ran before while the store was unreachable.
        record = record or self.base.started(attempt)
        if verdict == "lost":
            self.fail(_lost_failure(record, attempt), None)
        if verdict == "resend":
            # The retry was decided but its message may not have been accepted.
            self.resend_retry(record)
        if verdict == "redo_terminal":
            _raise_terminal(self.task, record, None)  # lets OjsRequest redo the dead letter
        logger.info("%s[%s]: attempt %d already done (record %s at %d); dropping duplicate",
                    self.task.name, self.request.id, attempt, record.state, record.attempt)
        raise Ignore()

    def begin(self, *, lease: bool = False) -> Begun | None:
        """Claim, read the record and (a new attempt) save it ``active``: one round trip,
        taking the lease first with ``lease`` (then ``Begun.leased`` says if it could).

        ``None`` where the store cannot do it in one (then ``load`` and ``claim``).
        """
        started = self.started_record = self.base.started(self.state.attempt)
        ttl = lease_ms() if lease else None
        try:
            return with_retry(self.task.app, lambda: self.store.begin(
                self.claim_key(), self.token(), started, lease_ms=ttl),
                operation="claim attempt")
        except Exception:  # the step-by-step path reports it, and requeues if need be
            return None

    def token(self) -> str:
        """``<copy token>|<delivery nonce>``: a retried claim whose reply was lost stays ours."""
        copy = str((self.request.headers or {}).get(TOKEN_HEADER) or "sent")
        return f"{copy}|{self.nonce}"

    def claim(self) -> Claim:
        """This copy's claim on its attempt (``RecordStore.claim``), waiting while the store
        is out of reach; given back to the broker unrun past ``deadline``: nothing runs
        unclaimed (the next delivery claims again)."""
        key, token = self.claim_key(), self.token()
        while True:
            try:
                claimed: Claim = with_retry(self.task.app, lambda: self.store.claim(key, token),
                                            operation="claim attempt")
                return claimed
            except Exception:
                self.give_back_or_wait("the job store is out of reach")

    def load_for_admission(self) -> JobRecord | None:
        """The stored record, waiting while the store is out of reach, as ``claim`` does:
        given back to the broker unrun past the deadline."""
        while True:
            try:
                record: JobRecord | None = with_retry(
                    self.task.app, lambda: self.store.load(self.request.id),
                    operation="read job record")
                return record
            except Exception:
                self.give_back_or_wait("the job record cannot be read")

    def claim_key(self) -> str:
        """``<task id>:<attempt>``, plus the replay round of a replayed dead letter."""
        key = attempt_id(self.request.id, self.state.attempt)
        replays = replay_round(self.request.headers)
        return f"{key}/replay{replays}" if replays else key

    def wait_for_countdown(self) -> None:
        """Never start before the countdown (RET-11), whatever the ETA timer's rounding."""
        if self.state.not_before is None:
            return
        remaining = float(self.state.not_before) - time.time()
        limit = self.state.countdowns[-1] if self.state.countdowns else 0.0
        if remaining > 0:
            time.sleep(min(remaining, limit))

    # -- after a failure ------------------------------------------------------------

    def fail(self, error: BaseException | Failure, exc: BaseException | None) -> NoReturn:
        """Decide on failed attempt ``state.attempt`` and carry the decision out."""
        sample = _jitter_sample(self.task) if self.policy.jitter else None
        budget = budget_of(self.task.app, self.dependency) if self.dependency else None
        decision = decide(
            self.policy, self.state.attempt, error, jitter_sample=sample,
            previous_delay=self.state.countdowns[-1] if self.state.countdowns else None,
            first_attempt_at=self.first_attempt_at, budget=budget)
        if decision.action == "retry":
            delay = float(decision.delay or 0.0)
            record = self.base.failed(decision.entry, action="retry", delay=delay)
            record = replace(record, extra={
                **record.extra,
                "countdowns": [*self.state.countdowns, delay],
                "jitter_samples": [*self.state.jitter_samples, decision.jitter_sample]})
            self.save(record)  # before the send: the next attempt must find it
            self.schedule_retry(record, exc, countdown=delay, not_before=time.time() + delay,
                                decision=decision)
        record = self.base.failed(decision.entry, action=decision.action,
                                  reason=decision.reason)
        if decision.action == "dead_letter":
            record = replace(record, extra={
                **record.extra, "dead_letter_queue": dead_letter_queue_for(self.task, self.queue)})
        self.save(record, last=True)
        self.report(decision)
        _raise_terminal(self.task, record, exc)

    def report(self, decision: Decision) -> None:
        """Hand the decision to the instrumentation hooks, once (a resend does not report)."""
        emit(DecisionEvent(framework="celery", job_id=self.request.id, task=self.task.name,
                           queue=self.queue, max_attempts=self.policy.max_attempts,
                           decision=decision, idempotency_key=self.key,
                           dependency=self.dependency))

    def resend_retry(self, record: JobRecord) -> NoReturn:
        """Send again the retry a record describes (its first send may have failed)."""
        not_before = _epoch(record.next_retry_at) or time.time()
        self.schedule_retry(record, None, countdown=max(0.0, not_before - time.time()),
                            not_before=not_before)

    def schedule_retry(self, record: JobRecord, exc: BaseException | None, *,
                       countdown: float, not_before: float,
                       decision: Decision | None = None) -> NoReturn:
        """A native Celery retry carrying the history of ``record``, after ``countdown`` s
        (parked on the broker if that is long: ``_parking``). ``decision`` is reported once
        the broker took the retry, or will be asked again (a resend reports nothing)."""
        header = replace(
            self.state, attempt=record.attempt + 1, errors=record.errors,
            countdowns=tuple(record.extra["countdowns"]),
            jitter_samples=tuple(record.extra["jitter_samples"]), not_before=not_before,
            first_attempt_at=self.first_attempt_at, idempotency_key=self.key)
        last = record.errors[-1]
        headers = merged(self.request.headers, **{HEADER: header.encode()},
                         **error_headers(last, record.attempt + 1))
        if exc is None:  # a lost attempt: what Celery stores with the RETRY state
            lost = TimeLimitExceeded if last.code == "HANDLER_TIMEOUT" else WorkerLostError
            exc = lost(last.message)
        cause = exc

        def publish_once() -> Retry:
            with confirming_connection(self.task.app) as conn:
                # a long countdown waits on the broker, not in a worker (RET-11, _parking)
                producer = parking_producer(self.task.app, conn, queue=self.queue,
                                            not_before=not_before) or conn.Producer()
                try:
                    Task.retry(self.task, exc=cause, countdown=countdown,
                               max_retries=self.policy.max_retries, retry=False,
                               producer=producer,
                               headers={**headers, TOKEN_HEADER: new_token()})
                except Retry as sent:
                    return sent
                except Reject as rejected:  # Task.retry's wrapping of a failed send
                    reason = rejected.reason
                    if isinstance(reason, NOT_THE_BROKER):  # a KombuError, yet no broker's
                        raise Unpublishable(reason) from reason
                    raise reason if isinstance(reason, Exception) else rejected from None
            raise AssertionError("Task.retry returned")  # pragma: no cover - it always raises

        try:
            sent = with_retry(self.task.app, publish_once, operation="publish retry")
        except OjsBackendError as error:
            # Task.retry would raise Reject(requeue=False) and drop the job: requeue
            # instead; the redelivery finds the record unmarked and publishes again.
            logger.error("%s[%s]: the broker did not accept the retry (%s); requeueing",
                         self.task.name, self.request.id, error.code)
            if decision is not None:
                self.report(decision)
            raise Reject(error, requeue=True) from None
        except Exception as error:  # not the broker: every try would fail the same way
            self.dead_letter_instead(record, error, exc)
        if decision is not None:
            self.report(decision)
        # Dropped if the retry already ran and saved its own; the lease goes with it.
        self.save(handed_off(record), last=True)
        # Without the frames of the publish (Task.retry inside the confirming connection):
        # Celery formats this traceback for every retry it logs, ~0.3-0.9 ms per frame set.
        raise sent.with_traceback(None)

    def dead_letter_instead(self, record: JobRecord, error: BaseException,
                            exc: BaseException | None) -> NoReturn:
        """The retry ``record`` decided cannot be published for a reason other than the
        broker: decide again on that failure (``_handoff.unpublishable``: dead letter),
        save and report it, and dead-letter the original (``OjsRequest``)."""
        decision = decide(self.policy, record.attempt, unpublishable("retry", error))
        logger.error("%s[%s]: %s; dead-lettering the job", self.task.name, self.request.id,
                     decision.entry.message, exc_info=error)
        dead = record.failed(decision.entry, action=decision.action, reason=decision.reason)
        dead = replace(dead, extra={
            **dead.extra, "dead_letter_queue": dead_letter_queue_for(self.task, self.queue)})
        self.save(dead, last=True)
        self.report(decision)
        _raise_terminal(self.task, dead, exc)

    # -- the record -----------------------------------------------------------------

    def load(self) -> JobRecord | None:
        try:
            return with_retry(self.task.app, lambda: self.store.load(self.request.id),
                              operation="read job record")
        except Exception:  # the record is an aid; the headers carry the truth
            count_failure("read job record", "failed")
            logger.warning("%s[%s]: cannot read the job record", self.task.name,
                           self.request.id, exc_info=True)
            return None

    def save(self, record: JobRecord, *, force: bool = False, last: bool = False) -> None:
        """Store ``record``; a write that fails even after its retries is logged and counted.

        A stored record of a later attempt is kept unless ``force`` (``RecordStore.save``).
        ``last``: the delivery's outcome, which gives up its lease in the same round trip.
        """
        release = (self.claim_key(), self.holder) if last and self.holder else None
        if release is not None:
            # Renewals stop first: a beat between the save's release and the end of the
            # delivery would take the released lease again (renewing creates a missing one).
            LEASES.drop(self.holder)
        # The outcome rides in the MULTI of Celery's own result write, which follows in
        # this thread before the ack (``_result_ride``; saved alone if that write does not
        # come): no round trip of its own.
        if last and not force and self.store.save_with_result(
                record, release, lambda: self._save_now(record, force, release)):
            self.released = release is not None
            return
        self._save_now(record, force, release)

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


def job_context(request: Any) -> JobContext:
    """The ``JobContext`` of a request, read from its headers (outside ``run_attempt``)."""
    state = HeaderState.from_headers(request.headers)
    replays = replay_info(request.headers).get("replay_count") or 0
    return JobContext(job_id=str(request.id), attempt=state.attempt,
                      idempotency_key=state.idempotency_key or str(request.id),
                      errors=state.errors, replay_count=int(replays))


def _header_policy(task: Any, state: HeaderState) -> RetryPolicy:
    """The policy for this delivery; a header policy that fails validation is ignored."""
    if state.ignored:
        logger.warning("%s[%s]: ignoring malformed ojs header fields %s", task.name,
                       task.request.id, ", ".join(state.ignored))
    try:
        return task.policy(state.policy)  # type: ignore[no-any-return]
    except OjsValidationError as exc:
        logger.warning("%s[%s]: ignoring the invalid retry policy in the ojs header: %s",
                       task.name, task.request.id, exc.message[:300])
        return task.policy()  # type: ignore[no-any-return]


def _requested_failure(request: RetryRequested) -> Failure:
    """``self.retry(exc=..., countdown=...)``: a RETRY failure; ``countdown`` a minimum delay."""
    return requested_retry(request.exc, request.countdown)


def _lost_failure(record: JobRecord, attempt: int) -> Failure:
    """What killed the previous delivery of ``attempt``: a hard time limit, or a lost worker."""
    lost = record.extra.get("lost")
    if isinstance(lost, dict) and lost.get("attempt") == attempt:
        timeout = TimeLimitExceeded(lost.get("timeout"))
        failure = describe_failure(timeout, catalog_code="HANDLER_TIMEOUT")
        return failure._replace(message=str(lost.get("message") or failure.message))
    return Failure.worker_lost()


def _raise_terminal(task: Any, record: JobRecord, exc: BaseException | None) -> NoReturn:
    klass = JobDeadLettered if record.dead_lettered else JobDiscarded
    last = record.errors[-1] if record.errors else None
    reason = f": {last.type}: {last.message}" if last else ""
    message = f"{task.name}[{record.id}] {record.outcome} after attempt {record.attempt}{reason}"
    raise klass(message, record.to_dict()) from exc


def _jitter_sample(task: Any) -> float:
    """u in [0, 1) from the task's ``jitter_source``, the app's, or ``random.random``."""
    source: Callable[[], float] | None = getattr(type(task), "jitter_source", None)
    if source is None:
        source = task.app.conf.get(JITTER_SETTING) or random.random
    return float(source())


def _epoch(iso: str | None) -> float | None:
    """POSIX time of an ISO 8601 UTC stamp as the core writes them."""
    if not iso:
        return None
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
