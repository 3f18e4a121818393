"""One delivery of an ``OjsTask`` in the worker: admit it, run it, carry the decision out.

``run_attempt`` follows the shared lifecycle (``ojs_adapters.runtime``): ``admit``
(lease, claim, judge: a repeated delivery never runs twice), the body, ``decide`` on a
failure, ``carry_out``. A retry is a native ``Task.retry`` with the exact countdown and
the history in the headers, sent before the ack (``_retry_send``: a confirming connection
on AMQP, the app's producer pool elsewhere); a dead letter or discard raises
``JobDeadLettered``/``JobDiscarded``, on which ``OjsRequest`` publishes the dead letter
before the ack. docs/lifecycle.md walks through it.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from celery.exceptions import Ignore, Reject, SoftTimeLimitExceeded, TimeLimitExceeded

from celery_ext import _publish_ride as publish_ride
from celery_ext._budgets import budget_of
from celery_ext._current import CONTEXT_ATTRIBUTE, RUNNING
from celery_ext._headers import HEADER, merged
from celery_ext._inputs import (
    RedoneDeadLetter,
    RetryRequested,
    epoch,
    header_policy,
    lost_failure,
    task_jitter_sample,
    terminal_error,
)
from celery_ext._parking import wants_park
from celery_ext._replace import SEAT_ATTRIBUTE, replaced_info
from celery_ext._result_ride import arm_peek
from celery_ext._retry_send import send_retry
from celery_ext._routing import dead_letter_queue_for, queue_of
from celery_ext._seat import AttemptSeat, logger
from celery_ext._self_retry import body_failure, next_call, without_call
from celery_ext._stand_in import retry_text, stand_in
from celery_ext._started import store_started
from celery_ext._unstored import expect_success
from celery_ext.dlq import replay_info
from ojs_adapters import Decision, JobContext, JobRecord, RetryPolicy, decide
from ojs_adapters.errors import OjsBackendError
from ojs_adapters.failure import Failure, describe_failure
from ojs_adapters.runtime.admission import Admission, admit
from ojs_adapters.runtime.delivery import Unpublished, carry_out, redecided
from ojs_adapters.runtime.events import DecisionEvent, emit
from ojs_adapters.runtime.handoff import error_headers, handed_off

__all__ = ["RetryRequested", "run_attempt"]


def run_attempt(task: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run one delivery of ``task`` in the worker and act on how it ends."""
    run = Delivery(task)
    if run.state.invalid is not None:  # unreadable OJS state: dead-letter it unrun (_headers)
        raise run.fail(run.state.invalid, None)
    outer, RUNNING.id = getattr(RUNNING, "id", None), task.request.id
    try:
        # Lease, claim, record read and ``active`` write: one round trip as a rule; alone
        # on the attempt from here (ojs_adapters.runtime.admission).
        previous = run.check_redelivery(admit(run, run.fresh, deadline=run.deadline))
        run.wait_for_countdown()
        if not run.started_saved:
            run.fresh = run.base.started(run.state.attempt)  # after the countdown wait
            run.save(run.fresh)
        run.start()
        store_started(task)  # task_track_started: only an admitted delivery says STARTED
        try:
            result = task.run(*args, **kwargs)
        except (Ignore, Reject) as raised:
            # Celery control flow the handler chose, not an OJS failure: a requeued delivery
            # starts the attempt afresh instead of counting as a crash; an ended job says so.
            run.handler_ended(raised, run.fresh, previous.stored)
            raise
        # What ends a failed attempt (Celery's ``Retry``, or ``JobDeadLettered`` with its
        # cause) is raised here, so the traceback Celery formats for it holds no frames of
        # ours below; its chain is its own (no ``from``). ``self.retry``: ``_self_retry``.
        except (SoftTimeLimitExceeded, TimeLimitExceeded) as exc:
            raise run.fail(describe_failure(exc, catalog_code="HANDLER_TIMEOUT"), exc)  # noqa: B904
        except Exception as exc:
            raise run.fail(*body_failure(run, exc))  # noqa: B904
        held = run.lease_alive()  # asked before the last save lets the lease go
        completed = run.fresh.completed()
        run.save(completed, last=True)
        expect_success(task.request.id, completed, run.save)  # unless Celery cannot store it
        if held:
            arm_peek()  # Celery's read before it stores SUCCESS: answered from admission
        return result
    finally:
        # The next delivery (a requeue after a failed hand-off, say) need not wait for the
        # lease to lapse. Usually the last save gives it up, with Celery's result write.
        RUNNING.id = outer
        run.release_lease()


class Delivery(AttemptSeat):
    """One delivery: its seat (``_seat``), policy and record, and how it carries out a
    decision (the ``Outcome`` of ``ojs_adapters.runtime.delivery``)."""

    def __init__(self, task: Any) -> None:
        super().__init__(task)
        self.policy: RetryPolicy = header_policy(task, self.state)
        self.queue = queue_of(task.app, self.request.delivery_info)
        self.first_attempt_at = self.state.first_attempt_at or time.time()
        # A message sent without OjsTask.apply_async (send_task) has no key: the task id,
        # which its retries and replays keep, serves as one.
        self.key = self.state.idempotency_key or str(self.request.id)
        self.dependency: str | None = getattr(type(task), "retry_budget", None)
        self.started_saved = False  # ``admit`` wrote the ``active`` record with the claim
        self.exc: BaseException | None = None  # what the failed attempt raised
        self.ending: BaseException | None = None  # what ``fail`` returns for its caller to raise
        self.base = JobRecord(
            id=self.request.id, type=task.name, queue=self.queue,
            max_attempts=self.policy.max_attempts, errors=self.state.errors,
            extra={"countdowns": list(self.state.countdowns),
                   "jitter_samples": list(self.state.jitter_samples),
                   "retry_policy": self.policy.to_dict(),
                   "idempotency_key": self.key,
                   **replay_info(self.request.headers),  # a replayed dead letter's count
                   **replaced_info(self)},  # and a replacement's (Task.replace)
        )
        self.fresh = self.base.started(self.state.attempt)  # this attempt's ``active`` record

    # -- before the body ------------------------------------------------------------

    def start(self) -> None:
        """The attempt runs: show its context to the body, count it against its budget."""
        setattr(self.request, SEAT_ATTRIBUTE, self)  # for a Task.replace (_replace)
        setattr(self.request, CONTEXT_ATTRIBUTE, JobContext(
            job_id=str(self.request.id), attempt=self.state.attempt, idempotency_key=self.key,
            errors=self.state.errors,
            replay_count=int(self.base.extra.get("replay_count") or 0)))
        if self.dependency is not None:
            budget_of(self.task.app, self.dependency).record_execution()

    def check_redelivery(self, admission: Admission) -> Admission:
        """Act on a delivery that repeats an attempt the record already knows about.

        Returns ``admission`` when this is a new attempt (the normal case): its
        ``stored()`` record is parsed only if the attempt is undone.
        """
        attempt = self.state.attempt
        verdict, record, self.started_saved, _ = admission
        if verdict == "run":
            return admission
        # "lost" without a record: this copy ran before while the store was unreachable.
        record = record or self.base.started(attempt)
        if verdict == "lost":
            raise self.fail(lost_failure(record, attempt), None)
        if verdict == "resend":
            # The retry was decided but its message may not have been accepted.
            raise self.resend_retry(record)
        if verdict == "redo_dead_letter":  # OjsRequest publishes it; Celery stores nothing
            error = terminal_error(self.task, record, None)
            raise RedoneDeadLetter(*error.args)
        logger.info("%s[%s]: attempt %d already done (record %s at %d); dropping duplicate",
                    self.task.name, self.request.id, attempt, record.state, record.attempt)
        raise Ignore()

    def wait_for_countdown(self) -> None:
        """Never start before the countdown (RET-11), whatever the ETA timer's rounding."""
        if self.state.not_before is None:
            return
        remaining = float(self.state.not_before) - time.time()
        limit = self.state.countdowns[-1] if self.state.countdowns else 0.0
        if remaining > 0:
            time.sleep(min(remaining, limit))

    # -- after a failure ------------------------------------------------------------

    def fail(self, error: BaseException | Failure, exc: BaseException | None) -> BaseException:
        """Decide on failed attempt ``state.attempt`` and carry the decision out; return what
        the caller raises: Celery's ``Retry`` once the retry is sent, else the terminal error
        (``JobDeadLettered``/``JobDiscarded``) that makes ``OjsRequest`` end the job."""
        if self.replaced and exc is not None:  # the job went on as its replacement: no
            return exc  # decision, the failure is Celery's alone (its ``Ignore`` swallowed)
        self.exc = exc
        sample = task_jitter_sample(self.task) if self.policy.jitter else None
        budget = budget_of(self.task.app, self.dependency) if self.dependency else None
        decision = decide(
            self.policy, self.state.attempt, error, jitter_sample=sample,
            previous_delay=self.state.countdowns[-1] if self.state.countdowns else None,
            first_attempt_at=self.first_attempt_at, budget=budget)
        carry_out(self, self.base, decision)
        assert self.ending is not None  # hand_off and end set it
        return self.ending

    # -- the ``Outcome`` of ``ojs_adapters.runtime.delivery.carry_out`` --------------

    def failed(self, record: JobRecord, decision: Decision) -> JobRecord:
        if decision.action == "retry":
            delay = float(decision.delay or 0.0)
            record = record.failed(decision.entry, action="retry", delay=delay)
            return replace(record, extra={
                **record.extra,
                "countdowns": [*self.state.countdowns, delay],
                "jitter_samples": [*self.state.jitter_samples, decision.jitter_sample]})
        record = without_call(record).failed(decision.entry, action=decision.action,
                                             reason=decision.reason)
        if decision.action == "dead_letter":
            record = replace(record, extra={
                **record.extra, "dead_letter_queue": dead_letter_queue_for(self.task, self.queue)})
        return record

    def hand_off(self, record: JobRecord, decision: Decision) -> None:
        # The record before the publish (the next attempt must find it): in the MULTI of the
        # retry's own push, marked handed off, where broker and backend are one Redis
        # (``_publish_ride``); else alone.
        delay = float(decision.delay or 0.0)
        not_before = time.time() + delay
        app = self.task.app
        riding = not wants_park(app, not_before) and self.store.save_with_publish(
            app, handed_off(without_call(record)), self.queue, first=True,
            alone=lambda: self.save(record))
        if not riding:
            self.save(record)
        try:
            self.ending = self.schedule_retry(record, self.exc, countdown=delay,
                                              not_before=not_before, decision=decision)
        except BaseException:
            if riding and not publish_ride.finish():
                self.save(record)  # not published with it: a redelivery must resend it
            raise
        if riding:  # a push that went without it: ``schedule_retry``'s last save marks it
            publish_ride.finish()
        arm_peek()  # RETRY is stored unless a SUCCESS is, checked in one script

    def end(self, record: JobRecord, decision: Decision) -> None:
        """Store the terminal record (with the lease's release), report, and keep what
        makes ``OjsRequest`` dead-letter or end the job (``_inputs.terminal_error``)."""
        held = self.lease_alive()  # asked before the last save lets the lease go
        self.save(record, last=True)
        self.report(decision)
        self.ending = terminal_error(self.task, record, self.exc)
        if held:
            arm_peek()  # no successor: Celery's read before it stores FAILURE, from admission

    def report(self, decision: Decision) -> None:
        """Hand the decision to the instrumentation hooks, once (a resend does not report)."""
        emit(DecisionEvent(framework="celery", job_id=self.request.id, task=self.task.name,
                           queue=self.queue, max_attempts=self.policy.max_attempts,
                           decision=decision, idempotency_key=self.key,
                           dependency=self.dependency))

    def resend_retry(self, record: JobRecord) -> BaseException:
        """Send again the retry a record describes (its first send may have failed); return
        what to raise, as ``fail`` does."""
        not_before = epoch(record.next_retry_at) or time.time()
        try:
            return self.schedule_retry(record, None,
                                       countdown=max(0.0, not_before - time.time()),
                                       not_before=not_before)
        except Unpublished as error:
            self.end(*redecided(self, record, error.cause))
        assert self.ending is not None
        return self.ending

    def schedule_retry(self, record: JobRecord, exc: BaseException | None, *,
                       countdown: float, not_before: float,
                       decision: Decision | None = None) -> BaseException:
        """A native Celery retry carrying the history of ``record``, after ``countdown`` s
        (parked on the broker if that is long: ``_parking``); returns the ``Retry`` to raise.
        ``decision`` is reported once the broker took the retry, or will be asked again (a
        resend reports nothing)."""
        header = replace(
            self.state, attempt=record.attempt + 1, errors=record.errors,
            countdowns=tuple(record.extra["countdowns"]),
            jitter_samples=tuple(record.extra["jitter_samples"]), not_before=not_before,
            first_attempt_at=self.first_attempt_at, idempotency_key=self.key)
        last = record.errors[-1]
        headers = merged(self.request.headers, **{HEADER: header.encode()},
                         **error_headers(last, record.attempt + 1))
        if exc is None:  # lost or resent: what Celery stores with the RETRY state, and the
            exc = self.exc = stand_in(last)  # cause should ``end`` follow instead
        try:
            sent = send_retry(self.task, exc or retry_text(last), countdown=countdown,
                              not_before=not_before,
                              queue=self.queue, max_retries=self.policy.max_retries,
                              headers=headers, **next_call(record))
        except OjsBackendError as error:
            # Task.retry would raise Reject(requeue=False) and drop the job: requeue
            # instead; the redelivery finds the record unmarked and publishes again.
            logger.error("%s[%s]: the broker did not accept the retry (%s); requeueing",
                         self.task.name, self.request.id, error.code)
            if decision is not None:
                self.report(decision)
            raise Reject(error, requeue=True) from None
        if decision is not None:
            self.report(decision)
        # Dropped if the retry already ran and saved its own; the lease goes with it.
        self.save(handed_off(without_call(record)), last=True)
        # Without the frames of the publish (Task.retry inside the confirming connection):
        # Celery formats this traceback for every retry it logs, ~0.3-0.9 ms per frame set.
        retry: BaseException = sent.with_traceback(None)
        return retry

