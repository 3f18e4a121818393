"""``OjsRetries``: the OJS retry policy, error history and dead-lettering for Dramatiq actors.

The middleware only translates Dramatiq events into ``ojs_adapters.decide`` inputs and
executes the ``Decision``; it never reasons about the policy itself.

- **One retry engine.** ``OjsRetries`` takes the place of Dramatiq's ``Retries``: the
  first time it sees the broker (an actor declared, a message sent, a worker booted)
  it puts itself in ``Retries``' slot of ``broker.middleware`` and a no-op in its own
  (logged at DEBUG; a WARNING if that ``Retries`` had settings of its own, ``_notices``).
  The slot matters: ``after_*`` hooks run in *reverse* order, so
  in ``Retries``' place (last in the defaults) its ``after_process_message`` runs
  before ``Results``, ``Callbacks`` and the rest, which then see the decided job
  record. The list keeps its length, so a swap during a hook's loop over the
  middleware neither skips nor repeats one.
- **Retry.** A failed attempt goes to ``decide``; ``retry`` re-enqueues a copy of the
  message (same id, queue, options, ``broker_priority``) with ``delay`` = the decision's
  seconds in whole milliseconds rounded up (RET-11), and ``options["ojs"]`` carrying
  the next attempt number and the history. A retry due in more than ``park_after``
  seconds (60) waits on the broker, not in a worker's delay queue (``_parking``).
- **Dead letter.** Dramatiq dead-letters with ``message.fail()``; the broker then moves
  the body it *stored* to ``<queue>.XQ`` (the Redis ``.msgs`` hash entry, the RabbitMQ
  delivery), not the options changed in memory. So the body marked ``"dead_letter":
  true`` with the full history goes there: on Redis it replaces the stored body and the
  message is failed (``_dead_letter``); on RabbitMQ it is enqueued as a copy that, when a
  worker picks it up, is failed at once (``message.fail()`` + ``SkipMessage``): the
  ``.XQ`` then holds the complete history on every broker. Its stuffed exception is a
  ``DeadLettered`` naming the last error, which ``Results`` stores for the message.
  To run a dead message again, enqueue a copy without ``options["ojs"]["dead_letter"]``.
- **Discard / fail** end the job: the message is acked, nothing is dead-lettered.
- **Time limits** (``TimeLimitExceeded``) are ``HANDLER_TIMEOUT`` failures.
- **Extensions** (issue 10). Every message gets an ``idempotency_key`` option as it is
  first sent (the sender's own, validated, or a UUID v4; R-6), kept by its retries,
  its dead letter and a replay, stored in the record and shown to the actor by
  ``dramatiq_ext.current_job()``. ``options["ojs"]`` carries ``first_attempt_at`` and
  the previous delay, for ``max_duration`` and decorrelated jitter. An actor naming a
  ``retry_budget`` counts each attempt that runs as an execution of that dependency,
  and the budget may veto its retries (R-7): ``retry_budgets`` (a ``RetryBudgets``),
  by default shared through the broker's Redis on a ``RedisBroker``, else per process.
- **Worker crashes.** The job record is written ``active`` as an attempt starts. A
  delivery whose attempt the record already shows ``active`` is one whose worker
  died (RabbitMQ redelivery, or the Redis broker re-pushing a dead worker's unacked
  message unchanged): it consumes that attempt with a ``HANDLER_PANIC`` entry
  (``Failure.worker_lost()``, RET-12) and follows the decision instead of running.
  This needs a store the next worker can read (see ``stores``).

**Safe hand-off** (issue 11). The successor of a failed attempt (its retry, or its
dead-letter hop) is published in ``after_process_message`` with publisher confirms on
RabbitMQ (``_handoff``) and the ``x-ojs-*`` error headers (ojs-errors.md 5.3), tried in
place on backend errors (``ojs_adapters.backend_retry``: 5 tries from 100 ms). Dramatiq
acks the original only afterwards (``post_process_message``); if the successor was not
accepted, ``before_ack`` tries again and otherwise raises an error Dramatiq treats as a
lost broker connection: it waits 5 s and calls ``before_ack`` again, so **the original
is acked only after its successor is on the broker**, and a worker stopped meanwhile
leaves it unacked, to be redelivered. The job record then says what a delivery is
(``ojs_adapters.handoff.judge_delivery``): the record is marked once the successor is
accepted; a redelivered original whose successor is not marked is published again;
and every attempt is *claimed* by the copy that runs it (``stores.claim``, keyed by
``<message id>:<attempt>``), so a successor published twice runs once. Before it
claims, a delivery takes a lease on its attempt, renewed while it lives (``_lease``):
another delivery of it meanwhile (RabbitMQ gives unacked messages back when a
connection drops, a delay-queue hop can be forwarded twice) waits for it instead of
counting a lost worker, and is then dropped as a duplicate. On RabbitMQ a held ack
is sent only on the channel its message came from (``_rabbitmq_acks``): Dramatiq
would send it, by delivery tag, on the new connection's channel, acking another message.

The final record of an attempt (and the ``handed_off`` mark) is saved before the ack
too; if the store stays down the ack waits up to ``RECORD_HOLD_SECONDS`` (15 s), then
goes without it (logged, counted ``write job record:abandoned``).

A successor that cannot be published for a reason other than the broker (it cannot be
encoded, another middleware's ``before_enqueue`` raises) would fail alike on every try.
A retry is then decided again: the job is dead-lettered with a history entry naming why
(``Failure.unpublishable``), saved and reported (only that decision is reported); a
dead-letter hop that cannot be published fails the original into ``.XQ`` as it came
(the record keeps the history). ``celery_ext`` does the same.

**Admission waits are bounded** (the same rule as ``celery_ext``): nothing runs without
its lease and its claim. A delivery waits, nothing run, while another live delivery
holds the lease or while the store is out of reach, at most ``CLAIM_WAIT_SECONDS``
(60 s) and never past its actor's time limit less ``LIMIT_MARGIN``; then it is given
back to the broker unrun (the same copy published again on its queue, the original
acked only once the broker took it; logged with the actor name) and tries again on its
next delivery. ``TimeLimit`` does not fire during the wait (it would be taken for the
attempt's own timeout) but keeps counting: the actor then runs with what is left of its
limit, as a Celery task does.

Windows that remain:

- The ack can be lost after the successor was accepted (the worker dies, or the link
  drops, between the two). The original comes back and is dropped as a duplicate (or,
  if the record mark was lost too, published again and the second copy dropped at its
  claim). Nothing is lost; one extra message may be delivered and discarded.
- A copy that ran while the store was unreachable and whose worker then died comes
  back with its own claim and a record that never saw it: it counts as a lost attempt
  (``HANDLER_PANIC``), never runs twice. So does a claim whose reply was lost.
- Dramatiq's Redis consumer drops its in-memory delay queue on a connection error
  (a Redis restart): the retries it held stay in that worker's ack set of
  ``<queue>.DQ``. ``_redis_delays`` puts them back on ``<queue>.DQ`` before the
  consumer starts again (issue 8); the RabbitMQ broker gives unacked messages back
  by itself. A Redis that restarts without persistence loses them all the same.
- While the broker is down, each held ack blocks its worker thread (Dramatiq retries
  it every 5 s).

Hook exceptions other than ``MiddlewareError`` are only logged by Dramatiq, so the
hooks here guard their I/O: a record that cannot be read or saved (after its in-place
retries) is logged and counted (``backend_retry.FAILURES_REGISTRY``), never failing
the job.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import Any, NamedTuple

from dramatiq.broker import Broker, MessageProxy
from dramatiq.common import q_name
from dramatiq.errors import BrokerConnectionError, Retry
from dramatiq.middleware import Middleware, MiddlewareError, Retries, SkipMessage, TimeLimit
from dramatiq.middleware.time_limit import TimeLimitExceeded

from dramatiq_ext._alerts import dead_lettered
from dramatiq_ext._context import clear_current_job, set_current_job
from dramatiq_ext._dead_letter import dead_letter_in_place
from dramatiq_ext._handoff import TOKEN_OPTION, Publisher, is_redis
from dramatiq_ext._lease import HEARTBEAT
from dramatiq_ext._notices import check_store, replaced_retries
from dramatiq_ext._options import (
    BUDGET_OPTION,
    KEY_OPTION,
    POLICY_OPTION,
    REJECTED_OPTIONS,
    TRANSLATED_OPTIONS,
    InvalidRetryPolicy,
    actor_policy,
    check_budget_option,
    check_message_options,
    ensure_idempotency_key,
    native_conflict,
    policy_option,
)
from dramatiq_ext._parking import DEFAULT_PREFIX, Parking
from dramatiq_ext._rabbitmq_acks import guard_acks
from dramatiq_ext._redis_delays import recover_delays
from dramatiq_ext._state import STATE_OPTION, MessageState, to_millis, with_countdown
from dramatiq_ext.stores import (
    DEFAULT_RECORD_TTL,
    RecordStore,
    claim,
    default_store,
    saves_in_order,
)
from ojs_adapters import (
    MIN_HISTORY,
    Decision,
    DecisionEvent,
    Failure,
    JobContext,
    JobRecord,
    RetryBudgets,
    RetryPolicy,
    RetryPolicyDict,
    decide,
    describe_failure,
    emit,
)
from ojs_adapters._instant import broker_delay, jitter_sample, note_job
from ojs_adapters.backend_retry import BackendRetry, count_failure
from ojs_adapters.budget import AnyRetryBudget
from ojs_adapters.claims import Begun, record_of
from ojs_adapters.errors import OjsBackendError
from ojs_adapters.failure import requested_retry
from ojs_adapters.handoff import Claim, attempt_id, error_headers, handed_off, judge_delivery
from ojs_adapters.history import utc_now
from ojs_adapters.keys import read_idempotency_key
from ojs_adapters.leases import WAIT_SECONDS, lease, lease_ms
from ojs_adapters.parking import DEFAULT_PARK_AFTER

#: A zero-argument callable returning the jitter sample u in [0, 1).
JitterSource = Callable[[], float]
#: Every actor option ``OjsRetries`` reads (Dramatiq refuses undeclared ones).
ACTOR_OPTIONS = frozenset({POLICY_OPTION, BUDGET_OPTION, *TRANSLATED_OPTIONS,
                           *REJECTED_OPTIONS})


class DeadLettered(Exception):
    """The exception a dead-lettered message carries into ``Results`` and ``StubBroker.join``."""


class _AttemptConsumed(MiddlewareError, Retry):
    """Stops a redelivered message whose lost attempt was just recorded.

    A ``MiddlewareError`` so ``emit_before`` lets it through, a ``Retry`` so the
    worker does not log it as an unhandled error; ``Results`` stores nothing for it.
    """


class _HandoffPending(MiddlewareError, BrokerConnectionError):
    """Holds the ack of a message whose successor the broker has not accepted yet.

    Raised from ``before_ack``: a ``MiddlewareError`` so ``emit_before`` lets it
    through, a ``BrokerConnectionError`` so ``post_process_message`` waits and tries
    the ack (and with it our ``before_ack``) again instead of acking.
    """

    def __init__(self, message: str) -> None:
        Exception.__init__(self, message)  # DramatiqError's __init__ is untyped
        self.message = message


class _Pending(NamedTuple):
    """What must be on the broker and in the store before the original is acked.

    ``message`` (a successor, or the delivery given back: ``hand_back``) is published
    first, then ``record`` saved (marked ``handed_off`` if ``mark``); ``None`` parts are done.
    """

    message: Any
    delay: int | None
    headers: dict[str, Any]
    record: JobRecord | None
    mark: bool = True
    since: float = 0.0  # time.monotonic() when only the record was left to save
    hand_back: bool = False  # the same copy again (its token kept), not a successor


#: Seconds the ack waits for a record that cannot be saved (the successor, forever).
RECORD_HOLD_SECONDS = 15.0
#: Seconds a delivery waits, nothing run, for another live delivery of its attempt or for an
#: unreachable store before it is given back to the broker (read at each use: tests shorten it).
CLAIM_WAIT_SECONDS = 60.0
#: Seconds of an actor's time limit a waiting delivery leaves unused.
LIMIT_MARGIN = 0.5
#: Where ``before_process_message`` leaves the record it wrote, for this delivery only.
_STARTED = "_ojs_started_record"
#: Where it leaves the POSIX time the attempt started.
_STARTED_AT = "_ojs_started_at"
#: Attribute of a ``MessageProxy`` holding the ``DeadLettered`` it was failed with.
_DEAD = "_ojs_dead_lettered"
#: Attribute of a ``MessageProxy`` holding its ``_Pending`` hand-off.
_PENDING = "_ojs_pending_successor"
#: Attribute of a ``MessageProxy`` naming the holder of its attempt's lease (``_lease``).
_LEASED = "_ojs_lease_holder"
#: Attribute set once a delivery said that it waits.
_WAITED = "_ojs_waited"
#: Attribute set when a retry that could not be published was decided again (dead letter).
_REDECIDED = "_ojs_redecided"



class _ReplacedRetries(Middleware):
    """The no-op left in ``OjsRetries``' former slot after it took ``Retries``' one."""

    def __repr__(self) -> str:
        return "<slot vacated by OjsRetries>"


class OjsRetries(Middleware):
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
        (``ojs_adapters.backend_retry.BackendRetry``; 5 tries from 100 ms).
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

    def __init__(
        self,
        *,
        default_policy: RetryPolicyDict | RetryPolicy | None = None,
        store: RecordStore | None = None,
        jitter_source: JitterSource | None = None,
        history_limit: int = MIN_HISTORY,
        record_ttl: int = DEFAULT_RECORD_TTL,
        backend_retry: BackendRetry | None = None,
        retry_budgets: RetryBudgets | None = None,
        park_after: float | None = DEFAULT_PARK_AFTER,
        park_prefix: str = DEFAULT_PREFIX,
    ) -> None:
        self.logger = logging.getLogger(f"{__name__}.{type(self).__name__}")
        self.default_policy = policy_option(default_policy, base=RetryPolicy(),
                                            where="default_policy")
        #: ``on_exhaustion`` as ``default_policy`` states it (it overrides native parity).
        # A ``RetryPolicy`` object states every field, ``on_exhaustion`` included.
        self._default_exhaustion: str | None = default_policy.on_exhaustion \
            if isinstance(default_policy, RetryPolicy) else default_policy.get("on_exhaustion") \
            if isinstance(default_policy, Mapping) else None
        self.jitter_source: JitterSource = jitter_source or random.random
        self.history_limit = max(history_limit, MIN_HISTORY)
        self.record_ttl = record_ttl
        self.backend_retry = backend_retry or BackendRetry()
        self.parking = Parking(park_after, park_prefix)
        self.publisher = Publisher(self.backend_retry, self.parking)
        self._store = store
        self._stores: weakref.WeakKeyDictionary[Broker, RecordStore] = weakref.WeakKeyDictionary()
        self._stores_lock = threading.Lock()
        self._actor_policies: dict[str, RetryPolicy] = {}
        self._actor_budgets: dict[str, str | None] = {}
        self._retry_budgets = retry_budgets
        self._default_budgets: weakref.WeakKeyDictionary[Broker, RetryBudgets] = (
            weakref.WeakKeyDictionary())

    @property
    def actor_options(self) -> set[str]:
        return set(ACTOR_OPTIONS)

    def store_for(self, broker: Broker) -> RecordStore:
        """The job-record store used with ``broker``."""
        if self._store is not None:
            return self._store
        store = self._stores.get(broker)
        if store is None:
            # Every worker thread asks on its first message: two MemoryRecordStores
            # would split a job's record between them.
            with self._stores_lock:
                store = self._stores.get(broker)
                if store is None:
                    store = self._stores[broker] = default_store(broker, ttl=self.record_ttl)
        return store

    def actor_policy(self, broker: Broker, actor_name: str) -> RetryPolicy:
        """The effective policy of an actor: its options over ``default_policy``.

        A message's own ``retry_policy`` is merged over this one when it runs.
        """
        policy = self._actor_policies.get(actor_name)
        if policy is None:
            actor = broker.get_actor(actor_name)
            policy = self._actor_policies[actor_name] = actor_policy(
                actor.options, self.default_policy, actor=actor_name,
                default_exhaustion=self._default_exhaustion)
        return policy

    # -- declaring and sending: validation (RET-16) -------------------------------------

    def before_declare_actor(self, broker: Broker, actor: Any) -> None:
        self._claim(broker)
        first = actor.actor_name not in self._actor_policies  # this hook runs twice per actor
        self._actor_policies[actor.actor_name] = actor_policy(
            actor.options, self.default_policy, actor=actor.actor_name,
            default_exhaustion=self._default_exhaustion)
        conflict = first and native_conflict(actor.options, actor=actor.actor_name,
                                             default_exhaustion=self._default_exhaustion)
        if conflict:
            self.logger.warning("%s", conflict)
        self._actor_budgets[actor.actor_name] = check_budget_option(
            actor.options, actor=actor.actor_name)

    # Called directly (exceptions reach the caller) for actors declared before
    # ``add_middleware``; after ``before_declare_actor`` otherwise.
    after_declare_actor = before_declare_actor

    def before_enqueue(self, broker: Broker, message: Any, delay: int | None) -> None:
        self._claim(broker)
        check_message_options(message.options, actor=message.actor_name)
        ensure_idempotency_key(message.options, actor=message.actor_name)

    def before_worker_boot(self, broker: Broker, worker: Any) -> None:
        self._claim(broker)
        recover_delays(broker)  # Redis: held retries come back after a lost link (issue 8)
        guard_acks(broker)  # RabbitMQ: no late ack lands on another message (issue 11)
        check_store(broker, self.store_for(broker), self.logger)  # records per process? (#16)

    def after_worker_boot(self, broker: Broker, worker: Any) -> None:
        # Parked retries reach .DQ when due (issue 8); with parking off too, so that
        # retries parked before it was turned off are not stranded.
        if is_redis(broker):
            self.parking.start_mover(broker)

    def after_worker_shutdown(self, broker: Broker, worker: Any) -> None:
        self.parking.stop_mover(broker)

    # -- processing ---------------------------------------------------------------------

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        started = time.monotonic()  # TimeLimit (before us in the list) started just now
        self._claim(broker)
        state = MessageState.of(message.options)
        if state.dead_letter:  # the hop to the dead-letter queue: fail it, never run it
            if self._claim_attempt(broker, message, state, "dead_letter") == "other":
                raise _AttemptConsumed("a second copy of a dead letter: dropped")
            message.fail()
            raise SkipMessage("dead-lettered by OjsRetries")
        policy = self._policy(broker, message)
        if state.invalid is not None:  # unreadable OJS state: dead-letter it unrun (_state)
            self.logger.error("Message %r carries unreadable OJS state (%s); dead-lettering it.",
                              message.message_id, state.invalid.message)
            self._execute(broker, message, state,
                          self._new_record(message, policy, state).started(state.attempt),
                          decide(policy, state.attempt, state.invalid))
            raise _AttemptConsumed("unreadable OJS state: dead-lettered (INVALID_PAYLOAD)")
        nonce = uuid.uuid4().hex  # this delivery: a retried claim whose reply was lost is ours
        # ``begin`` may write the ``active`` record with the claim: a first attempt's (no
        # record yet), or a later one's when the message carries the whole record
        # (``MessageState.countdowns``), over the record of the attempt before.
        fresh = self._new_record(message, policy, state).started(state.attempt) \
            if state.attempt == 1 or state.countdowns is not None else None
        # Lease, claim, record read and ``active``: one round trip.
        begun = self._begin(broker, message, state, nonce, fresh, lease=True)
        if begun is not None and begun.leased:
            self._hold_lease(broker, message, state, nonce)
        else:  # another live delivery holds the lease, no one-call store, or unreachable:
            # step by step, waiting (nothing run) at most until ``deadline``
            deadline = started + self._wait_limit(broker, message)
            with _time_limit_held(broker, message, started):
                self._lease_attempt(broker, message, state, nonce, deadline)  # alone now
                begun = self._begin(broker, message, state, nonce, fresh)
                if begun is None:  # a store without ``begin``, or unreachable
                    # A record that cannot be read is not a missing one: judged as missing,
                    # a copy's own redelivery ("mine") would count its finished attempt lost.
                    record = self._wait_for_record(broker, message, state, deadline)
                    claimed = self._wait_for_claim(broker, message, state, nonce, deadline)
                    if claimed == "new" and record is not None and record == fresh:
                        record = None  # our own start, by a ``begin`` whose replies were lost
        if begun is not None:
            claimed = begun.claim
            record = record_of(begun.record)
        verdict = judge_delivery(record, state.attempt, claim=claimed)
        if verdict == "run":
            if begun is not None and begun.wrote and fresh is not None:
                record = fresh  # saved by ``begin`` with the claim (one round trip)
            else:
                record = (record or self._new_record(message, policy, state)).started(
                    state.attempt)
                self._save(broker, record)
            vars(message)[_STARTED] = record  # after_process_message needs no second read
            vars(message)[_STARTED_AT] = time.time()
            set_current_job(JobContext(job_id=message.message_id, attempt=state.attempt,
                                       idempotency_key=_key_of(message), errors=state.errors,
                                       replay_count=state.replay_count))
            budget = self._budget(broker, message.actor_name)
            if budget is not None:
                budget.record_execution()
            return
        # "lost" without a record: this copy ran before while the store was unreachable.
        record = record or self._new_record(message, policy, state).started(state.attempt)
        if verdict == "lost":
            self.logger.warning("Message %r arrived again during attempt %d: its worker died.",
                                message.message_id, state.attempt)
            state = state._replace(first_attempt_at=state.first_attempt_at or time.time())
            decision = self._decide(broker, message, policy, state, Failure.worker_lost())
            self._execute(broker, message, state, record, decision)
            raise _AttemptConsumed("attempt lost with its worker (HANDLER_PANIC)")
        if verdict == "resend":
            self.logger.warning("Message %r arrived again after attempt %d was decided: "
                                "publishing its retry again.", message.message_id, record.attempt)
            self._resend(broker, message, state, record)
        elif verdict == "redo_terminal":
            self.logger.warning("Message %r arrived again after it was dead-lettered: "
                                "publishing the dead letter again.", message.message_id)
            self._hand_off(broker, message, state._replace(dead_letter=True,
                                                           errors=record.errors), record, None)
        else:
            self.logger.info("Dropping a duplicate of message %r, attempt %d (record: %s at %d).",
                             message.message_id, state.attempt, record.state, record.attempt)
        raise _AttemptConsumed(f"attempt {state.attempt} already handled ({verdict})")

    def after_process_message(self, broker: Broker, message: MessageProxy, *,
                              result: Any = None, exception: BaseException | None = None) -> None:
        clear_current_job()
        if isinstance(exception, _AttemptConsumed):
            dead = vars(message).pop(_DEAD, None)
            if dead is not None:  # dead-lettered in place before the worker stuffed this
                message.stuff_exception(dead)
            return
        state = MessageState.of(message.options)
        policy = self._policy(broker, message)
        # The record this delivery wrote as it started (no store read); else read it.
        record = vars(message).pop(_STARTED, None) or self._load(broker, message.message_id)
        if record is None:  # an earlier middleware stopped the message before our hook
            record = self._new_record(message, policy, state).started(state.attempt)
        if exception is None:
            self._save_before_ack(broker, message, record.completed())
            return
        if state.first_attempt_at is None:  # attempt 1 (or sent without it): started now
            started = vars(message).pop(_STARTED_AT, None)
            state = state._replace(first_attempt_at=started or time.time())
        decision = self._decide(broker, message, policy, state, _failure_of(exception))
        self._execute(broker, message, state, record, decision)

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        clear_current_job()
        state = MessageState.of(message.options)
        if state.dead_letter and message.failed:
            self._failed_to_dead_letters(message, state)

    def _failed_to_dead_letters(self, message: MessageProxy, state: MessageState) -> None:
        """``message`` is failed: its nack puts it in ``.XQ``. What ``Results`` stores for it
        (a ``DeadLettered`` naming the last error), the log line, the on_dead_letter hooks."""
        message.fail()
        if state.errors:
            last = state.errors[-1]
            dead = DeadLettered(f"{last.code} {last.type}: {last.message}")
            message.stuff_exception(dead)
            vars(message)[_DEAD] = dead  # the worker may stuff its own after us: put back
        self.logger.info("Message %r dead-lettered to %r after attempt %d.",
                         message.message_id, f"{q_name(message.queue_name)}.XQ", state.attempt)
        dead_lettered(message, state)  # the on_dead_letter hooks (ojs_adapters.alerts)

    def _dead_letter_in_place(self, broker: Broker, message: MessageProxy, state: MessageState,
                              record: JobRecord) -> bool:
        """A ``RedisBroker``'s dead letter: the stored body becomes the dead-letter copy (with
        the record's save, one call) and the nack moves it to ``.XQ`` (``_dead_letter``).
        ``False``: not here, or the call failed: publish a copy instead (``_hand_off``)."""
        dead = _successor(message, state).copy(
            options=error_headers(record.errors[-1], record.attempt))
        store = self.store_for(broker)
        try:
            done = self.backend_retry.call(lambda: dead_letter_in_place(
                broker, store, message, dead, record), operation="write dead letter")
        except Exception:
            self.logger.warning("Could not write the dead letter of %r in place; publishing "
                                "a copy.", message.message_id, exc_info=True)
            return False
        if done is None:
            return False
        if not done:  # the records live elsewhere: saved now, before the nack
            self._save_before_ack(broker, message, record)
        self._failed_to_dead_letters(message, state)
        return True

    # -- executing a decision -----------------------------------------------------------

    def _execute(self, broker: Broker, message: MessageProxy, state: MessageState,
                 record: JobRecord, decision: Decision) -> None:
        note_job("dramatiq", message.message_id, broker)  # where instant_retries() reads it
        state = state.after(decision.entry, keep=self.history_limit)
        record = record.failed(decision.entry, action=decision.action, delay=decision.delay,
                               keep=self.history_limit, reason=decision.reason)
        if decision.action == "retry" and decision.delay is not None:
            millis = to_millis(decision.delay)
            record = with_countdown(record, decision.delay, millis)
            # Saved before the enqueue: the next attempt may start at once.
            self._save(broker, record)
            self.logger.debug("Retrying message %r as attempt %d in %d ms.",
                              message.message_id, state.attempt + 1, millis)
            successor = state._replace(attempt=state.attempt + 1, previous_delay=decision.delay,
                                       **_carried(record))
            self._hand_off(broker, message, successor, record, millis)
            if vars(message).pop(_REDECIDED, False):
                return  # not publishable: dead-lettered instead, and that decision reported
        elif decision.action == "dead_letter":
            self.logger.debug("Dead-lettering message %r (%s).", message.message_id,
                              decision.reason)
            dead = state._replace(dead_letter=True)
            if not self._dead_letter_in_place(broker, message, dead, record):
                self._save(broker, record)
                self._hand_off(broker, message, dead, record, None)
        else:
            self._save_before_ack(broker, message, record)
            self.logger.debug("Ending message %r: %s (%s).", message.message_id,
                              decision.action, decision.reason)
        self._report(message, record, decision)

    def _report(self, message: MessageProxy, record: JobRecord, decision: Decision) -> None:
        """The structured log (``ojs_adapters.logs``) and metrics hooks see each decision once."""
        emit(DecisionEvent(framework="dramatiq", job_id=message.message_id,
                           task=message.actor_name, queue=q_name(message.queue_name),
                           max_attempts=record.max_attempts, decision=decision,
                           idempotency_key=_key_of(message),
                           dependency=self._actor_budgets.get(message.actor_name)))

    def _dead_letter_instead(self, broker: Broker, message: MessageProxy, record: JobRecord,
                             error: BaseException) -> None:
        """The retry ``record`` decided cannot be published for a reason other than the
        broker: decide again on that failure (``Failure.unpublishable``: dead letter), save
        and report it, and hand off the dead letter (``_REDECIDED`` tells ``_execute``)."""
        decision = decide(self._policy(broker, message), record.attempt,
                          Failure.unpublishable("retry", error))
        self.logger.error("%s[%s]: %s; dead-lettering the job.", message.actor_name,
                          message.message_id, decision.entry.message, exc_info=error)
        record = record.failed(decision.entry, action=decision.action,
                               keep=self.history_limit, reason=decision.reason)
        self._save(broker, record)
        state = MessageState.of(message.options)._replace(dead_letter=True, errors=record.errors)
        self._hand_off(broker, message, state, record, None)
        self._report(message, record, decision)
        vars(message)[_REDECIDED] = True

    # -- the hand-off: successor accepted before the original is acked ------------------

    def _hand_off(self, broker: Broker, message: MessageProxy, state: MessageState,
                  record: JobRecord, delay: int | None) -> None:
        """Publish the successor ``state`` describes; if it fails, keep it for ``before_ack``."""
        attempt = record.attempt if state.dead_letter else state.attempt
        # Inside a test's instant_retries() the broker gets 0 ms; the record keeps the delay.
        delay = broker_delay(delay)
        pending = _Pending(_successor(message, state), delay,
                           error_headers(record.errors[-1], attempt), record)
        self._publish_pending(broker, message, pending)

    def _resend(self, broker: Broker, message: MessageProxy, state: MessageState,
                record: JobRecord) -> None:
        """Publish again the retry ``record`` decided (its first publish may not have landed)."""
        due = record.next_retry_at
        wait = 0.0
        if due:
            wait = (datetime.fromisoformat(due.replace("Z", "+00:00")) - utc_now()).total_seconds()
        successor = state._replace(attempt=record.attempt + 1, errors=record.errors,
                                   **_carried(record))
        self._hand_off(broker, message, successor, record, to_millis(max(wait, 0.0)))

    def _publish_pending(self, broker: Broker, message: MessageProxy, pending: _Pending) -> bool:
        """Do what ``pending`` still needs; ``False`` (kept on the message) if it cannot yet."""
        if pending.message is not None:
            what = "delivery given back" if pending.hand_back else "dead letter" \
                if MessageState.of(pending.message.options).dead_letter else "retry"
            try:
                self.publisher.publish(broker, pending.message, delay=pending.delay,
                                       headers=pending.headers, operation=f"publish {what}",
                                       keep_token=pending.hand_back)
            except OjsBackendError as error:
                self.logger.error("The %s of message %r was not accepted (%s); holding the "
                                  "ack until it is.", what, message.message_id, error.code)
                vars(message)[_PENDING] = pending
                return False
            except Exception as error:  # not the broker: every try would fail alike
                vars(message).pop(_PENDING, None)
                if what == "retry" and pending.record is not None:
                    self._dead_letter_instead(broker, message, pending.record, error)
                    return _PENDING not in vars(message)  # the dead letter may be held
                self.logger.error("%s[%s]: could not publish the %s (%s: %s); dead-lettering "
                                  "the original as it came.", message.actor_name,
                                  message.message_id, what, type(error).__name__, error,
                                  exc_info=error)
                message.fail()
                if pending.record is not None:  # the on_dead_letter hooks, as for a hop
                    dead_lettered(message, MessageState.of(message.options)._replace(
                        attempt=pending.record.attempt, errors=pending.record.errors))
                return True
            pending = pending._replace(message=None)
        if pending.record is not None:
            record = handed_off(pending.record) if pending.mark else pending.record
            if pending.mark and not saves_in_order(self.store_for(broker)) and \
                    self._newer_attempt_started(broker, record):
                # The successor already ran and wrote its own record: this late mark
                # would overwrite it with an older history (it lost an entry under load).
                vars(message).pop(_PENDING, None)
                return True
            if not self._save(broker, record):
                since = pending.since or time.monotonic()
                if time.monotonic() - since < RECORD_HOLD_SECONDS:
                    # A redelivery must find it: hold the ack, for a while.
                    vars(message)[_PENDING] = pending._replace(since=since)
                    return False
                count_failure("write job record", "abandoned")
                self.logger.error("Acking message %r without its job record (store down "
                                  "for %.0f s).", message.message_id, RECORD_HOLD_SECONDS)
        vars(message).pop(_PENDING, None)
        return True

    def _newer_attempt_started(self, broker: Broker, record: JobRecord) -> bool:
        """Whether the store already holds a later attempt of ``record``'s job.

        A read before the write: it shrinks the window for a stale overwrite from the
        whole publish-to-save gap to one store round trip; it does not close it.
        """
        try:
            current = self._load(broker, record.id)
        except Exception:
            return False
        return current is not None and current.attempt > record.attempt

    def _save_before_ack(self, broker: Broker, message: MessageProxy, record: JobRecord) -> None:
        """Save an attempt's final record; if the store is down, hold the ack until it is saved.

        Without it a redelivered original (its ack lost too) would not know the attempt ended.
        """
        if not self._save(broker, record):
            vars(message)[_PENDING] = _Pending(None, None, {}, record, mark=False)

    def before_ack(self, broker: Broker, message: MessageProxy) -> None:
        pending = vars(message).get(_PENDING)
        if pending is not None:
            failed = message.failed
            if not self._publish_pending(broker, message, pending):
                raise _HandoffPending(f"successor of {message.message_id} not accepted; "
                                      "ack held")
            if message.failed and not failed:  # failed into .XQ instead: Dramatiq chose
                # the ack already; on this error it waits, looks again, and nacks.
                raise _HandoffPending(f"{message.message_id} dead-lettered; nack, not ack")
        HEARTBEAT.drop(vars(message).pop(_LEASED, ""))  # the outcome is stored: let it lapse

    before_nack = before_ack

    def _lease_attempt(self, broker: Broker, message: MessageProxy, state: MessageState,
                       nonce: str, deadline: float) -> None:
        """Take this delivery's lease on its attempt (``_lease``), waiting, nothing run,
        while another live delivery holds it or while the store is out of reach. Returns
        without the lease once the record shows the attempt over (this delivery is then a
        duplicate), or at once if the store keeps no leases; gives the delivery back
        (``_give_back_or_wait``) rather than wait past ``deadline``."""
        store, key = self.store_for(broker), _claim_key(message, state)
        holder = f"{_token_of(message)}|{nonce}"
        while True:
            try:
                taken = self.backend_retry.call(lambda: lease(store, key, holder, lease_ms()),
                                                operation="lease attempt")
            except Exception:
                self._give_back_or_wait(broker, message, state, deadline,
                                        "the job store is out of reach")
                continue
            if taken is None:
                return  # a store that keeps no leases (said at worker start)
            if taken:
                self._hold_lease(broker, message, state, nonce)
                return
            if judge_delivery(self._load(broker, message.message_id), state.attempt,
                              claim="mine") == "duplicate":
                return  # the holder's outcome is stored (it lets its lease lapse)
            self._give_back_or_wait(broker, message, state, deadline,
                                    f"another delivery of attempt {state.attempt} is alive")

    def _give_back_or_wait(self, broker: Broker, message: MessageProxy, state: MessageState,
                           deadline: float, why: str) -> None:
        """Wait ``WAIT_SECONDS`` more, nothing run, or give the delivery back to the broker
        unrun if that would pass ``deadline``: the same copy (its token kept, so to the
        claims it is a redelivery) is published on its queue, and this one acked only
        once the broker took it (else the ack is held, as for a successor)."""
        if time.monotonic() + WAIT_SECONDS > deadline:
            self.logger.warning("%s[%s]: attempt %d not run: %s; given back to the broker.",
                                message.actor_name, message.message_id, state.attempt, why)
            self._publish_pending(broker, message, _Pending(
                message.copy(), None, {}, None, mark=False, hand_back=True))
            raise _AttemptConsumed(f"attempt {state.attempt} given back to the broker: {why}")
        if not vars(message).get(_WAITED):
            vars(message)[_WAITED] = True
            self.logger.warning("%s[%s]: attempt %d waits, not run: %s.", message.actor_name,
                                message.message_id, state.attempt, why)
        time.sleep(WAIT_SECONDS)

    def _wait_limit(self, broker: Broker, message: MessageProxy) -> float:
        """Seconds this delivery may wait: ``CLAIM_WAIT_SECONDS``, and less than its time limit."""
        limit = _time_limit_ms(broker, message)
        if limit is None:
            return CLAIM_WAIT_SECONDS
        return min(CLAIM_WAIT_SECONDS, limit / 1000 - LIMIT_MARGIN)

    def _hold_lease(self, broker: Broker, message: MessageProxy, state: MessageState,
                    nonce: str) -> None:
        """Renew this delivery's lease until its outcome is stored (``before_ack``)."""
        holder = f"{_token_of(message)}|{nonce}"
        HEARTBEAT.hold(self.store_for(broker), _claim_key(message, state), holder)
        vars(message)[_LEASED] = holder

    def _wait_for_claim(self, broker: Broker, message: MessageProxy,
                        state: MessageState, nonce: str, deadline: float) -> Claim:
        """The claim, waiting (unacked, nothing run) while the store is out of reach; the
        delivery is given back to the broker past ``deadline``: nothing runs unclaimed."""
        while True:
            claimed = self._claim_attempt(broker, message, state, nonce=nonce)
            if claimed is not None:
                return claimed
            self._give_back_or_wait(broker, message, state, deadline,
                                    "the job store is out of reach")

    def _wait_for_record(self, broker: Broker, message: MessageProxy, state: MessageState,
                         deadline: float) -> JobRecord | None:
        """The job record, waiting (unacked, nothing run) while the store is out of reach,
        as for the claim: past ``deadline`` the delivery is given back to the broker."""
        store = self.store_for(broker)
        while True:
            try:
                data = self.backend_retry.call(lambda: store.load(message.message_id),
                                               operation="read job record")
            except OjsBackendError:
                self._give_back_or_wait(broker, message, state, deadline,
                                        "the job record cannot be read")
                continue
            return JobRecord.from_dict(data) if data else None

    def _begin(self, broker: Broker, message: MessageProxy, state: MessageState, nonce: str,
               fresh: JobRecord | None, *, lease: bool = False) -> Begun | None:
        """Claim, read the record and (first attempt) save ``fresh``, in one store call,
        taking the attempt's lease first with ``lease`` (``Begun.leased``).

        ``None`` when the store has no ``begin`` (then one call each) or cannot be
        reached now (the step-by-step path waits for it).
        """
        store = self.store_for(broker)
        begin = getattr(store, "begin", None)
        if begin is None:
            return None
        key, token = _claim_key(message, state), f"{_token_of(message)}|{nonce}"
        try:
            begun: Begun = self.backend_retry.call(
                lambda: begin(key, token, self.record_ttl, message.message_id,
                              None if fresh is None else fresh.to_dict(),
                              **({"lease_ms": lease_ms()} if lease else {}),
                              **({"attempt": state.attempt} if state.attempt > 1 else {})),
                operation="claim attempt")
        except Exception:
            return None
        return begun

    def _claim_attempt(self, broker: Broker, message: MessageProxy, state: MessageState,
                       step: str | None = None, nonce: str = "") -> Claim | None:
        """Whether this copy may run ``state.attempt`` (or ``step``); ``None``: store down."""
        key = _claim_key(message, state, step)
        token = f"{_token_of(message)}|{nonce or uuid.uuid4().hex}"
        store = self.store_for(broker)
        try:
            return self.backend_retry.call(lambda: claim(store, key, token, self.record_ttl),
                                           operation="claim attempt")
        except OjsBackendError:
            return None

    # -- helpers ------------------------------------------------------------------------

    def _claim(self, broker: Broker) -> None:
        """Take Dramatiq's ``Retries`` slot (see the module docstring)."""
        slots = broker.middleware
        for index, other in enumerate(slots):
            if isinstance(other, Retries):
                mine = next((i for i, m in enumerate(slots) if m is self), None)
                slots[index] = self
                if mine is not None:
                    slots[mine] = _ReplacedRetries()
                level, why = replaced_retries(other)
                self.logger.log(level, "OjsRetries replaced %r at position %d: %s", other,
                                index, why)

    def _policy(self, broker: Broker, message: MessageProxy) -> RetryPolicy:
        base = self.actor_policy(broker, message.actor_name)
        try:
            return policy_option(message.options.get(POLICY_OPTION), base=base,
                                 where=f"message {message.message_id}")
        except InvalidRetryPolicy:  # sent by a producer without OjsRetries
            self.logger.exception("Ignoring the invalid retry_policy of %r.", message.message_id)
            # Dropped from this delivery, so its retry or dead letter (copies of it) is
            # not refused by ``before_enqueue`` and runs under the actor's policy too.
            message.options.pop(POLICY_OPTION, None)
            return base

    def _sample(self, policy: RetryPolicy) -> float | None:
        return jitter_sample(self.jitter_source) if policy.jitter else None  # pinnable in tests

    def _decide(self, broker: Broker, message: MessageProxy, policy: RetryPolicy,
                state: MessageState, failure: Failure) -> Decision:
        """``decide`` for failed attempt ``state.attempt``, with the opt-in extensions' inputs."""
        return decide(policy, state.attempt, failure, jitter_sample=self._sample(policy),
                      previous_delay=state.previous_delay,
                      first_attempt_at=state.first_attempt_at,
                      budget=self._budget(broker, message.actor_name))

    def retry_budgets(self, broker: Broker) -> RetryBudgets:
        """The budgets actors on ``broker`` draw on (see ``retry_budgets``)."""
        if self._retry_budgets is not None:
            return self._retry_budgets
        budgets = self._default_budgets.get(broker)
        if budgets is None:
            with self._stores_lock:
                budgets = self._default_budgets.get(broker)
                if budgets is None:
                    client = getattr(broker, "client", None)  # a RedisBroker's redis client
                    budgets = self._default_budgets[broker] = RetryBudgets(client)
        return budgets

    def _budget(self, broker: Broker, actor_name: str) -> AnyRetryBudget | None:
        if actor_name not in self._actor_budgets:  # declared before this middleware saw it
            options = broker.get_actor(actor_name).options
            self._actor_budgets[actor_name] = check_budget_option(options, actor=actor_name)
        dependency = self._actor_budgets[actor_name]
        return self.retry_budgets(broker).get(dependency) if dependency else None

    def _new_record(self, message: MessageProxy, policy: RetryPolicy,
                    state: MessageState) -> JobRecord:
        """A record from what the message carries (no record yet, the store is down, or
        the message carries the whole record: ``MessageState.countdowns``)."""
        extra: dict[str, Any] = {"idempotency_key": _key_of(message)}
        if state.countdowns is not None and state.delays_ms is not None:
            extra.update(countdowns=list(state.countdowns), delays_ms=list(state.delays_ms))
        if state.replay_count:  # as ``ojs_adapters.dlq.replayed_record`` stamped it
            extra.update(replay_count=state.replay_count,
                         last_replayed_at=state.last_replayed_at)
        return JobRecord(id=message.message_id, type=message.actor_name,
                         queue=q_name(message.queue_name), max_attempts=policy.max_attempts,
                         errors=state.errors, extra=extra)

    def _load(self, broker: Broker, message_id: str) -> JobRecord | None:
        store = self.store_for(broker)
        try:
            data = self.backend_retry.call(lambda: store.load(message_id),
                                           operation="read job record")
        except Exception:
            count_failure("read job record", "failed")
            self.logger.exception("Could not read the job record of %r.", message_id)
            return None
        return JobRecord.from_dict(data) if data else None

    def _save(self, broker: Broker, record: JobRecord) -> bool:
        """Store ``record``; ``False`` (logged and counted) if even the retries failed."""
        store, data = self.store_for(broker), record.to_dict()
        try:
            self.backend_retry.call(lambda: store.save(record.id, data),
                                    operation="write job record")
        except Exception:  # the record is an aid: never fail the job for it
            count_failure("write job record", "failed")
            self.logger.exception("Could not save the job record of %r.", record.id)
            return False
        return True


def _time_limits(broker: Broker) -> list[TimeLimit]:
    return [m for m in broker.middleware if isinstance(m, TimeLimit)]


def _time_limit_ms(broker: Broker, message: MessageProxy) -> float | None:
    """The shortest ``TimeLimit`` this delivery runs under, in ms (``None``: none)."""
    actor = broker.get_actor(message.actor_name)
    limits = [message.options.get("time_limit") or actor.options.get("time_limit", m.time_limit)
              for m in _time_limits(broker)]
    found = [float(limit) for limit in limits if limit]
    return min(found) if found else None


@contextmanager
def _time_limit_held(broker: Broker, message: MessageProxy, started: float) -> Iterator[None]:
    """Dramatiq's ``TimeLimit`` kept from firing in this thread while admission waits (it
    would be taken for the attempt's own timeout), then set again to what is left of the
    limit since ``started``: the wait counts, as a Celery time limit counts from the start
    of the delivery, but never ends the attempt (the wait ends before: ``_wait_limit``)."""
    limits = _time_limits(broker)
    for limit in limits:
        limit.after_process_message(broker, message)  # type: ignore[no-untyped-call]
    try:
        yield
    finally:
        actor = broker.get_actor(message.actor_name)
        spent = (time.monotonic() - started) * 1000
        for limit in limits:
            total = message.options.get("time_limit") or actor.options.get(
                "time_limit", limit.time_limit)
            left = max(1, int(float(total) - spent))
            limit.manager.add_timeout(threading.get_ident(), left)  # type: ignore[no-untyped-call]


def _claim_key(message: MessageProxy, state: MessageState, step: str | None = None) -> str:
    """``<message id>:<attempt>`` (``/<step>``, ``/replay<n>``): what a copy claims to run."""
    key = attempt_id(message.message_id, state.attempt)
    if step:
        key += f"/{step}"
    if state.replay_count:
        key += f"/replay{state.replay_count}"
    return key


def _carried(record: JobRecord) -> dict[str, Any]:
    """What a successor's state carries of ``record`` to write its ``active`` record alone."""
    countdowns, delays = record.extra.get("countdowns"), record.extra.get("delays_ms")
    if not isinstance(countdowns, list) or not isinstance(delays, list):
        return {"countdowns": None, "delays_ms": None}
    return {"countdowns": tuple(countdowns), "delays_ms": tuple(delays)}


def _successor(message: MessageProxy, state: MessageState) -> Any:
    """The copy of ``message`` that ``state`` describes (a retry, or the dead letter)."""
    return message.copy(options={STATE_OPTION: state.to_option(), KEY_OPTION: _key_of(message)})


def _key_of(message: Any) -> str:
    """The message's idempotency key; the message id for one sent without ``OjsRetries``."""
    return read_idempotency_key(message.options.get(KEY_OPTION)) or message.message_id


def _token_of(message: MessageProxy) -> str:
    """The token of this copy of the message ("sent": the producer's own send)."""
    return str(message.options.get(TOKEN_OPTION) or "sent")


def _failure_of(exception: BaseException) -> Failure:
    """What ``decide`` needs to know about an exception a Dramatiq actor raised."""
    if isinstance(exception, TimeLimitExceeded):
        return describe_failure(exception, catalog_code="HANDLER_TIMEOUT")
    if isinstance(exception, Retry):
        # The handler asks for a retry, as Celery's ``self.retry(exc=...)``: the failure is
        # what it was handling (``raise Retry(...) from exc``, or raised in ``except``),
        # with handler code RETRY and its delay (ms) as a floor (``requested_retry``).
        cause = exception.__cause__
        if cause is None and not exception.__suppress_context__:
            cause = exception.__context__
        delay = exception.delay / 1000 if exception.delay is not None else None
        return requested_retry(None if isinstance(cause, Retry) else cause, delay)
    return describe_failure(exception)
