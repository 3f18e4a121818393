"""How a Dramatiq delivery carries out a decision (the ``Outcome`` of ``runtime.delivery``).

A retry is a copy of the message (same id, queue, options) carrying the next attempt's
state, published after ``delay`` ms (RET-11) or parked on the broker if that is long
(``_parking``). A dead letter on a ``RedisBroker`` replaces the stored body with the
full-history copy and fails the message, so Dramatiq's own nack moves it to ``.XQ``
(``_dead_letter``); elsewhere a dead-letter copy is published, and failed unrun when a
worker takes it. Discard and fail end the job: the message is acked.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from dramatiq.broker import Broker, MessageProxy
from dramatiq.common import q_name
from dramatiq.errors import Retry
from dramatiq.middleware import MiddlewareError

from dramatiq_ext._alerts import dead_lettered
from dramatiq_ext._dead_letter import dead_letter_in_place
from dramatiq_ext._ended import (
    FAILURE_OPTION,
    JobDeadLettered,
    dead_letter_exception,
    raised_pair,
    store_ended,
)
from dramatiq_ext._handoff import TOKEN_OPTION
from dramatiq_ext._held_ack import PENDING, AckGate, Pending
from dramatiq_ext._options import KEY_OPTION
from dramatiq_ext._records import key_of
from dramatiq_ext._redis_retry import enqueue_with_record, shares_redis
from dramatiq_ext._state import STATE_OPTION, MessageState, to_millis, with_countdown
from ojs_adapters import Decision, JobRecord, RetryPolicy
from ojs_adapters.history import utc_now
from ojs_adapters.runtime._instant import broker_delay
from ojs_adapters.runtime.backend_retry import BackendRetry, backend_error, count_failure
from ojs_adapters.runtime.delivery import Unpublished, redecided
from ojs_adapters.runtime.events import DecisionEvent, emit
from ojs_adapters.runtime.handoff import error_headers, handed_off
from ojs_adapters.runtime.tokens import new_token

#: Attribute of a ``MessageProxy`` holding the ``JobDeadLettered`` it was failed with.
DEAD = "_ojs_dead_lettered"


#: The name this exception had before it took Celery's (kept for ``except`` clauses).
DeadLettered = JobDeadLettered


class AttemptConsumed(MiddlewareError, Retry):
    """Stops a delivery that must not run (its attempt was handled, or it was given back).

    A ``MiddlewareError`` so ``emit_before`` lets it through, a ``Retry`` so the
    worker does not log it as an unhandled error; ``Results`` stores nothing for it.
    ``failed``: it stands for a failed attempt (``Callbacks`` sends ``on_failure`` only
    then, ``_callbacks``).
    """

    def __init__(self, message: str = "", *, failed: bool = False) -> None:
        super().__init__(message)
        self.failed = failed


class DeliveryOutcome:
    """One delivery's decisions carried out: ``failed``, ``save``, ``hand_off``, ``end``."""

    def __init__(self, broker: Broker, message: MessageProxy, state: MessageState, *,
                 policy: RetryPolicy, gate: AckGate, backend_retry: BackendRetry,
                 history_limit: int, dependency: str | None, logger: logging.Logger) -> None:
        self.broker, self.message, self.state, self.policy = broker, message, state, policy
        self.gate, self.retry, self.keep = gate, backend_retry, history_limit
        self.dependency, self.logger = dependency, logger
        self.label = f"{message.actor_name}[{message.message_id}]"

    def failed(self, record: JobRecord, decision: Decision) -> JobRecord:
        """``record`` after ``decision`` (its successor carries the record's history)."""
        record = record.failed(decision.entry, action=decision.action, delay=decision.delay,
                               keep=self.keep, reason=decision.reason)
        if decision.action == "retry":
            delay = decision.delay or 0.0
            record = with_countdown(record, delay, to_millis(delay))
        return record

    def save(self, record: JobRecord) -> None:
        self.gate.records.save(record)

    def hand_off(self, record: JobRecord, decision: Decision) -> None:
        """Publish the retry (held for ``before_ack`` if the broker refuses it), report."""
        delay = decision.delay or 0.0
        millis = to_millis(delay)
        self.logger.debug("Retrying message %r as attempt %d in %d ms.",
                          self.message.message_id, self.state.attempt + 1, millis)
        state = self.state._replace(attempt=self.state.attempt + 1, previous_delay=delay,
                                    errors=record.errors, **_carried(record))
        if not self._retry_in_one_call(state, record, millis):
            self.save(record)  # before the publish: the next attempt must find it
            self.publish(state, record, millis)
        self.report(record, decision)

    def _retry_in_one_call(self, state: MessageState, record: JobRecord, millis: int) -> bool:
        """On a ``RedisBroker`` that holds the records too, enqueue the retry and save its
        record marked handed off in one script (``_redis_retry``). ``False``: not here (or
        parked), or that call failed: the caller saves, then publishes (with its retries
        and the held ack); a copy of a try whose reply was lost is dropped by its claim."""
        store, delay = self.gate.records.store, broker_delay(millis)
        if not shares_redis(self.broker, store) or self.gate.publisher.parking.wants(delay):
            return False
        retry = successor(self.message, state).copy(options={
            **error_headers(record.errors[-1], state.attempt), TOKEN_OPTION: new_token()})
        try:
            enqueue_with_record(self.broker, store, retry, delay, handed_off(record))
        except Exception as exc:
            failure = backend_error(exc, operation="publish retry")
            if failure is not None:  # counted as the two-step path's failed tries are
                count_failure("publish retry", failure.code)
            self.logger.warning("Could not enqueue the retry of %r with its record in one "
                                "call; saving, then publishing.", self.message.message_id,
                                exc_info=True)
            return False
        return True

    def end(self, record: JobRecord, decision: Decision) -> None:
        """Dead-letter the job (in place on Redis, else a copy), or end it; report."""
        if decision.action == "dead_letter":
            self.logger.debug("Dead-lettering message %r (%s).", self.message.message_id,
                              decision.reason)
            dead = self.state._replace(dead_letter=True, errors=record.errors)
            if not self._dead_letter_in_place(dead, record):
                self.save(record)
                self.publish_or_redecide(dead, record, None)
        else:
            self.gate.save_before_ack(self.message, record)
            self.logger.debug("Ending message %r: %s (%s).", self.message.message_id,
                              decision.action, decision.reason)
            store_ended(self.broker, self.message, decision.entry, self.logger)
        self.report(record, decision)

    def report(self, record: JobRecord, decision: Decision) -> None:
        """The structured log (``runtime.logs``) and metrics hooks see each decision once."""
        message = self.message
        emit(DecisionEvent(framework="dramatiq", job_id=message.message_id,
                           task=message.actor_name, queue=q_name(message.queue_name),
                           max_attempts=record.max_attempts, decision=decision,
                           idempotency_key=key_of(message), dependency=self.dependency))

    # -- a delivery that repeats a decided attempt ---------------------------------------

    def resend(self, record: JobRecord) -> None:
        """Publish again the retry ``record`` decided (its first publish may not have landed)."""
        due, wait = record.next_retry_at, 0.0
        if due:
            wait = (datetime.fromisoformat(due.replace("Z", "+00:00")) - utc_now()).total_seconds()
        successor = self.state._replace(attempt=record.attempt + 1, errors=record.errors,
                                        **_carried(record))
        self.publish_or_redecide(successor, record, to_millis(max(wait, 0.0)))

    def redo_dead_letter(self, record: JobRecord) -> None:
        """Publish again the dead letter ``record`` decided."""
        self.publish_or_redecide(self.state._replace(dead_letter=True, errors=record.errors),
                                 record, None)

    # -- publishing ---------------------------------------------------------------------

    def publish(self, state: MessageState, record: JobRecord, delay: int | None) -> None:
        """Publish the successor ``state`` describes; if the broker refuses, hold the ack."""
        attempt = record.attempt if state.dead_letter else state.attempt
        # Inside a test's instant_retries() the broker gets 0 ms; the record keeps the delay.
        self.gate.settle(self.message, Pending(
            successor(self.message, state), broker_delay(delay),
            error_headers(record.errors[-1], attempt), record))

    def publish_or_redecide(self, state: MessageState, record: JobRecord,
                            delay: int | None) -> None:
        """``publish``; a retry that cannot be published is decided again (dead letter)."""
        try:
            self.publish(state, record, delay)
        except Unpublished as error:
            self.end(*redecided(self, record, error.cause))

    def settle_held(self, pending: Pending) -> bool:
        """``AckGate.settle`` for ``before_ack``: the held retry may now be unpublishable."""
        try:
            return self.gate.settle(self.message, pending)
        except Unpublished as error:
            assert pending.record is not None
            self.end(*redecided(self, pending.record, error.cause))
            return PENDING not in vars(self.message)  # the dead letter may be held

    def _dead_letter_in_place(self, state: MessageState, record: JobRecord) -> bool:
        """A ``RedisBroker``'s dead letter: the stored body becomes the dead-letter copy (with
        the record's save, one call) and the nack moves it to ``.XQ`` (``_dead_letter``).
        ``False``: not here, or the call failed: publish a copy instead. The record is
        saved marked ``handed_off``: once the body is replaced it reaches ``.XQ`` (the nack,
        or a redelivery of the replaced body failed unrun), so another delivery of this
        attempt (a twin copy of its retry) is a duplicate, not a dead letter to redo."""
        message, records = self.message, self.gate.records
        record = handed_off(record)
        try:
            dead = successor(message, state).copy(
                options=error_headers(record.errors[-1], record.attempt))
            done = self.retry.call(lambda: dead_letter_in_place(
                self.broker, records.store, message, dead, record),
                operation="write dead letter")
        except Exception:
            self.logger.warning("Could not write the dead letter of %r in place; publishing "
                                "a copy.", message.message_id, exc_info=True)
            return False
        if done is None:
            return False
        if not done:  # the records live elsewhere: saved now, before the nack
            self.gate.save_before_ack(message, record)
        failed_to_dead_letters(message, state, self.logger)
        return True


def failed_to_dead_letters(message: MessageProxy, state: MessageState,
                           logger: logging.Logger) -> None:
    """``message`` is failed: its nack puts it in ``.XQ``. What ``Results`` stores for it
    (a ``JobDeadLettered`` named as the last error, ``_ended``), the log line, the
    on_dead_letter hooks."""
    message.fail()
    dead = dead_letter_exception(message, state)
    if dead is not None:
        message.stuff_exception(dead)
        vars(message)[DEAD] = dead  # the worker may stuff its own after us: put back
    logger.info("Message %r dead-lettered to %r after attempt %d.",
                message.message_id, f"{q_name(message.queue_name)}.XQ", state.attempt)
    dead_lettered(message, state)  # the on_dead_letter hooks (ojs_adapters.runtime.alerts)


def successor(message: MessageProxy, state: MessageState) -> Any:
    """The copy of ``message`` that ``state`` describes (a retry, or the dead letter, which
    carries its last exception's class name and text for ``Results``: ``_ended``)."""
    options: dict[str, Any] = {STATE_OPTION: state.to_option(), KEY_OPTION: key_of(message)}
    if state.dead_letter:
        options[FAILURE_OPTION] = raised_pair(message)
    return message.copy(options=options)


def _carried(record: JobRecord) -> dict[str, Any]:
    """What a successor's state carries of ``record`` to write its ``active`` record alone."""
    countdowns, delays = record.extra.get("countdowns"), record.extra.get("delays_ms")
    if not isinstance(countdowns, list) or not isinstance(delays, list):
        return {"countdowns": None, "delays_ms": None}
    return {"countdowns": tuple(countdowns), "delays_ms": tuple(delays)}
