"""``OjsRetries``: the OJS retry policy, error history and dead letters for Dramatiq actors.

The middleware translates Dramatiq's hooks into the shared lifecycle
(``ojs_adapters.runtime``: ``admission.admit``, ``decide``, ``delivery.carry_out``);
it never reasons about the policy itself. ``before_process_message`` admits a delivery
(lease, claim, judge: ``_lease``); ``after_process_message`` decides on a failure and
carries the decision out (``_outcome``); ``before_ack`` holds the ack until the
successor is on the broker and the record is stored (``_held_ack``). docs/lifecycle.md
walks through it, with the windows that remain.
"""

from __future__ import annotations

import time
from typing import Any, NoReturn

from dramatiq.broker import Broker, MessageProxy
from dramatiq.middleware import MiddlewareError, SkipMessage
from dramatiq.threading import Interrupt

from dramatiq_ext import _ack_ride as ack_ride
from dramatiq_ext._context import clear_current_job, set_current_job
from dramatiq_ext._ended import RAISED, JobDeadLettered
from dramatiq_ext._failure import failure_of, throws_of
from dramatiq_ext._held_ack import PENDING, AckGate, HandoffPending, Pending
from dramatiq_ext._lease import (
    LEASE_RENEWER,
    LEASED,
    DeliverySeat,
    claim_step,
    time_limit_ms,
    time_limit_over,
)
from dramatiq_ext._outcome import (
    DEAD,
    AttemptConsumed,
    DeadLettered,
    DeliveryOutcome,
    failed_to_dead_letters,
)
from dramatiq_ext._quiet_hop import quiet_hop
from dramatiq_ext._records import Records, key_of, new_record
from dramatiq_ext._settings import ACTOR_OPTIONS, JitterSource, RetriesSettings
from dramatiq_ext._state import MessageState
from dramatiq_ext._unrun import ADMITTED, end_skipped, given_back
from ojs_adapters import JobContext, JobRecord, RetryPolicy, decide
from ojs_adapters.decision import Decision
from ojs_adapters.failure import Failure
from ojs_adapters.runtime._instant import note_job
from ojs_adapters.runtime.admission import admit, wait_limit
from ojs_adapters.runtime.delivery import carry_out

__all__ = ["ACTOR_OPTIONS", "DeadLettered", "JitterSource", "JobDeadLettered", "OjsRetries"]

#: Where ``before_process_message`` leaves the record it wrote, for this delivery only.
_STARTED = "_ojs_started_record"
#: Where it leaves the POSIX time the attempt started.
_STARTED_AT = "_ojs_started_at"
#: Where the hooks keep the delivery's ``MessageState``, read once.
_STATE = "_ojs_state"
#: The exception (``None``: none) the first ``after_process_message`` of a delivery was given.
_OUTCOME = "_ojs_outcome"
#: Set once the delivery's outcome was carried out (a second call does nothing).
_DECIDED = "_ojs_decided"


class OjsRetries(RetriesSettings):
    """Retry failed messages as the OJS retry policy says; replaces Dramatiq's ``Retries``.

    Parameters:
      default_policy: A (partial) policy mapping or ``RetryPolicy`` for actors and
        messages without their own ``retry_policy``; the OJS default otherwise.
      store: Where job records go (``stores.RecordStore``); by default the
        ``Results`` backend, else the Redis broker's Redis, else process memory (then a
        worker says at start what that turns off: ``_notices``).
      jitter_source: Returns the jitter sample u in [0, 1); seed it in tests.
      history_limit: Error entries kept in the message and the record (>= 10).
      record_ttl: Milliseconds a job record is kept.
      backend_retry: How broker and store calls are retried in place
        (``ojs_adapters.runtime.backend_retry.BackendRetry``; 5 tries from 100 ms).
      retry_budgets: The budgets actors name with ``retry_budget=`` (R-7); by default
        shared through the broker's Redis on a ``RedisBroker``, else per process.
      park_after: Retries waiting longer than this many seconds wait on the broker, not
        in a worker (``_parking``, RET-11); ``None``: Dramatiq's delay queue for all.
      park_prefix: Name prefix of the RabbitMQ delay levels (``<prefix>_dramatiq_delayed_*``).

    Example::

        broker = RedisBroker(url="redis://127.0.0.1:6379/0")
        broker.add_middleware(OjsRetries(default_policy={"max_attempts": 5}))

        @dramatiq.actor(broker=broker, retry_policy={"on_exhaustion": "dead_letter"})
        def charge(order_id): ...

        charge.send_with_options(args=(7,), retry_policy={"max_attempts": 2})
    """

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        started = time.monotonic()  # TimeLimit (before us in the list) started just now
        try:
            self._admit(broker, message, started)
        except MiddlewareError:
            raise
        except Exception as error:  # Dramatiq would log it and run the actor unadmitted
            if vars(message).get(ADMITTED):  # after the verdict: only the job context failed
                self.logger.exception("Message %r: admitted, then: %r", message.message_id,
                                      error)
                return
            self.logger.critical("Message %r: admission failed (%r); given back unrun.",
                                 message.message_id, error, exc_info=True)
            self._give_back(broker, message, _state_of(message), f"admission failed: {error!r}")

    def _admit(self, broker: Broker, message: MessageProxy, started: float) -> None:
        self._take_retries_slot(broker)
        state = _state_of(message)
        if state.dead_letter:  # the hop to the dead-letter queue: fail it, never run it
            if claim_step(self.store_for(broker), self.backend_retry, message, state,
                          "dead_letter", self.record_ttl) == "other":
                raise AttemptConsumed("a second copy of a dead letter: dropped")
            message.fail()
            quiet_hop(message)  # no "was skipped" WARNING for it (INFO in after_skip_message)
            raise SkipMessage("dead-lettered by OjsRetries")
        policy = self._policy(broker, message)
        if state.invalid is not None:  # unreadable OJS state: dead-letter it unrun (_state)
            self.logger.error("Message %r carries unreadable OJS state (%s); dead-lettering it.",
                              message.message_id, state.invalid.message)
            self._carry_out(broker, message, state, policy,
                            new_record(message, policy, state).started(state.attempt),
                            decide(policy, state.attempt, state.invalid))
            raise AttemptConsumed("unreadable OJS state: dead-lettered (INVALID_PAYLOAD)",
                                  failed=True)
        # ``admit`` may write the ``active`` record with the claim: a first attempt's (no
        # record yet), or a later one's when the message carries the whole record
        # (``MessageState.countdowns``), over the record of the attempt before.
        fresh = new_record(message, policy, state).started(state.attempt) \
            if state.attempt == 1 or state.countdowns is not None else None
        seat = DeliverySeat(
            broker, message, state, store=self.store_for(broker),
            backend_retry=self.backend_retry, record_ttl=self.record_ttl, logger=self.logger,
            started=started, give_back=lambda why: self._give_back(broker, message, state, why))

        def deadline() -> float:  # asked only if the delivery has to wait
            limit = time_limit_ms(broker, message)
            return started + wait_limit(None if limit is None else limit / 1000)

        # Lease, claim, record read and ``active``: one round trip, as a rule.
        verdict, record, wrote, _ = admit(seat, fresh, deadline=deadline)
        if verdict == "run":
            vars(message)[ADMITTED] = True
            note_job("dramatiq", message.message_id, broker)  # instant_retries() reads it
            if wrote and fresh is not None:
                record = fresh  # saved by ``admit`` with the claim (one round trip)
            else:
                record = (record or new_record(message, policy, state)).started(state.attempt)
                self._records(broker).save(record)
            vars(message)[_STARTED] = record  # after_process_message needs no second read
            vars(message)[_STARTED_AT] = time.time()
            set_current_job(JobContext(job_id=message.message_id, attempt=state.attempt,
                                       idempotency_key=key_of(message), errors=state.errors,
                                       replay_count=state.replay_count))
            budget = self._budget(broker, message.actor_name)
            if budget is not None:
                budget.record_execution()
            return
        # "lost" without a record: this copy ran before while the store was unreachable.
        record = record or new_record(message, policy, state).started(state.attempt)
        if verdict == "lost":
            self.logger.warning("Message %r arrived again during attempt %d: its worker died.",
                                message.message_id, state.attempt)
            state = state._replace(first_attempt_at=state.first_attempt_at or time.time())
            decision = self._decide(broker, message, policy, state, Failure.worker_lost())
            self._carry_out(broker, message, state, policy, record, decision)
            raise AttemptConsumed("attempt lost with its worker (HANDLER_PANIC)", failed=True)
        if verdict == "resend":
            self.logger.warning("Message %r arrived again after attempt %d was decided: "
                                "publishing its retry again.", message.message_id, record.attempt)
            self._outcome(broker, message, state, policy).resend(record)
        elif verdict == "redo_dead_letter":
            self.logger.warning("Message %r arrived again after it was dead-lettered: "
                                "publishing the dead letter again.", message.message_id)
            self._outcome(broker, message, state, policy).redo_dead_letter(record)
        else:
            self.logger.info("Dropping a duplicate of message %r, attempt %d (record: %s at %d).",
                             message.message_id, state.attempt, record.state, record.attempt)
        raise AttemptConsumed(f"attempt {state.attempt} already handled ({verdict})")

    def after_process_message(self, broker: Broker, message: MessageProxy, *,
                              result: Any = None, exception: BaseException | None = None) -> None:
        time_limit_over(broker, message)  # the actor is done; what follows is ours
        # An interrupt raised out of a later after hook makes Dramatiq call every after hook
        # again, with the interrupt: the first outcome stands, and a finished call is not redone.
        exception = vars(message).setdefault(_OUTCOME, exception)
        if not vars(message).get(_DECIDED):
            self._after(broker, message, exception)
            vars(message)[_DECIDED] = True

    def _after(self, broker: Broker, message: MessageProxy,
               exception: BaseException | None) -> None:
        clear_current_job()
        if isinstance(exception, AttemptConsumed):
            dead = vars(message).pop(DEAD, None)
            if dead is not None:  # dead-lettered in place before the worker stuffed this
                message.stuff_exception(dead)
            return
        if isinstance(exception, Interrupt) and not vars(message).get(ADMITTED):
            # Interrupted (a time limit, a shutdown) before admission let it run: no attempt.
            self.logger.warning("Message %r interrupted (%r) before it ran; given back unrun.",
                                message.message_id, exception)
            self._gate(broker).settle(message, given_back(message))
            return
        state = _state_of(message)
        policy = self._policy(broker, message)
        # The record this delivery wrote as it started (no store read); else read it.
        record = vars(message).get(_STARTED) or self._records(broker).load(message.message_id)
        if record is None:  # an earlier middleware stopped the message before our hook
            record = new_record(message, policy, state).started(state.attempt)
        if exception is None:
            self._gate(broker).save_before_ack(message, record.completed())
            return
        if state.first_attempt_at is None:  # attempt 1 (or sent without it): started now
            started = vars(message).get(_STARTED_AT)
            state = state._replace(first_attempt_at=started or time.time())
        failure = failure_of(exception, throws_of(broker, message))  # Retry vs throws: native
        decision = self._decide(broker, message, policy, state, failure)
        vars(message)[RAISED] = exception  # what Results stores if the job ends (_ended)
        self._carry_out(broker, message, state, policy, record, decision)

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        time_limit_over(broker, message)
        clear_current_job()
        state = _state_of(message)
        if state.dead_letter:  # our own hop to the dead-letter queue
            if message.failed:
                failed_to_dead_letters(message, state, self.logger)
            return
        if not vars(message).get(_DECIDED):  # the actor or a middleware skipped it
            vars(message)[_DECIDED] = True
            fresh = new_record(message, self._policy(broker, message), state).started(
                state.attempt)
            end_skipped(message, state, self._records(broker), vars(message).get(_STARTED),
                        fresh)

    def before_ack(self, broker: Broker, message: MessageProxy) -> None:
        pending: Pending | None = vars(message).get(PENDING)
        if pending is not None:
            failed = message.failed
            outcome = self._outcome(broker, message, _state_of(message),
                                    self._policy(broker, message))
            if not outcome.settle_held(pending):
                raise HandoffPending(f"successor of {message.message_id} not accepted; "
                                     "ack held")
            if message.failed and not failed:  # failed into .XQ instead: Dramatiq chose
                # the ack already; on this error it waits, looks again, and nacks.
                raise HandoffPending(f"{message.message_id} dead-lettered; nack, not ack")
        ack_ride.arm(broker, message, self.store_for(broker))  # a stashed record goes with it
        # The outcome is stored (on a RedisBroker, it goes with the ack): let the lease lapse.
        LEASE_RENEWER.drop(vars(message).pop(LEASED, ""))

    before_nack = before_ack

    # -- helpers ------------------------------------------------------------------------

    def _carry_out(self, broker: Broker, message: MessageProxy, state: MessageState,
                   policy: RetryPolicy, record: JobRecord, decision: Decision) -> None:
        note_job("dramatiq", message.message_id, broker)  # where instant_retries() reads it
        carry_out(self._outcome(broker, message, state, policy), record, decision)

    def _outcome(self, broker: Broker, message: MessageProxy, state: MessageState,
                 policy: RetryPolicy) -> DeliveryOutcome:
        return DeliveryOutcome(broker, message, state, policy=policy, gate=self._gate(broker),
                               backend_retry=self.backend_retry,
                               history_limit=self.history_limit,
                               dependency=self.dependency_of(message.actor_name),
                               logger=self.logger)

    def _records(self, broker: Broker) -> Records:
        return Records(self.store_for(broker), self.backend_retry, self.logger)

    def _gate(self, broker: Broker) -> AckGate:
        return AckGate(broker, self.publisher, self._records(broker), self.logger)

    def _give_back(self, broker: Broker, message: MessageProxy, state: MessageState,
                   why: str) -> NoReturn:
        """Give the delivery back to the broker unrun: the same copy (its token kept, so to
        the claims it is a redelivery) is published on its queue, and this one acked only
        once the broker took it (else the ack is held, as for a successor)."""
        self._gate(broker).settle(message, given_back(message))
        raise AttemptConsumed(f"attempt {state.attempt} given back to the broker: {why}")


def _state_of(message: MessageProxy) -> MessageState:
    """This delivery's OJS state, read once per delivery (its options do not change)."""
    state: MessageState | None = vars(message).get(_STATE)
    if state is None:
        state = vars(message)[_STATE] = MessageState.of(message.options)
    return state
