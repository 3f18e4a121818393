"""``OjsRetries``' settings, and what they resolve to per broker, actor and message.

``OjsRetries`` takes the place of Dramatiq's ``Retries``: the first time it sees the
broker (an actor declared, a message sent, a worker booted) it puts itself in
``Retries``' slot of ``broker.middleware`` and a no-op in its own (logged at DEBUG); the
settings of a ``Retries`` the user configured become every actor's native defaults
(``_native``; an INFO line, a WARNING for what cannot carry over, ``_notices``). The slot matters:
``after_*`` hooks run in reverse order, so there its ``after_process_message`` runs
before ``Results``, ``Callbacks`` and the rest, which then see the decided job record.
The list keeps its length, so a swap during a hook's loop neither skips nor repeats one.
"""

from __future__ import annotations

import logging
import random
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from dramatiq.broker import Broker, MessageProxy
from dramatiq.middleware import Middleware, Retries

from dramatiq_ext._callbacks import quiet_unrun
from dramatiq_ext._handoff import Publisher, is_redis
from dramatiq_ext._native import STOCK, defaults_of
from dramatiq_ext._notices import check_prometheus, check_store, replaced_retries
from dramatiq_ext._options import (
    BUDGET_OPTION,
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
from dramatiq_ext._state import MessageState
from dramatiq_ext.stores import DEFAULT_RECORD_TTL, RecordStore, default_store
from ojs_adapters import Decision, RetryPolicy, RetryPolicyDict, decide
from ojs_adapters.failure import Failure
from ojs_adapters.history import MIN_HISTORY
from ojs_adapters.runtime._instant import jitter_sample
from ojs_adapters.runtime.backend_retry import BackendRetry
from ojs_adapters.runtime.budget import AnyRetryBudget, RetryBudgets
from ojs_adapters.runtime.parking import DEFAULT_PARK_AFTER

#: A zero-argument callable returning the jitter sample u in [0, 1).
JitterSource = Callable[[], float]
#: Every actor option ``OjsRetries`` reads (Dramatiq refuses undeclared ones).
ACTOR_OPTIONS = frozenset({POLICY_OPTION, BUDGET_OPTION, *TRANSLATED_OPTIONS,
                           *REJECTED_OPTIONS})


class _ReplacedRetries(Middleware):
    """The no-op left in ``OjsRetries``' former slot after it took ``Retries``' one."""

    def __repr__(self) -> str:
        return "<slot vacated by OjsRetries>"


class RetriesSettings(Middleware):
    """The settings of ``OjsRetries`` (its docstring has the parameters), the hooks of
    declaring, sending and booting, and the policy, budget and store each job gets."""

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
        # the logger name users configure: OjsRetries is defined in ``middleware``
        self.logger = logging.getLogger(f"dramatiq_ext.middleware.{type(self).__name__}")
        self.default_policy = policy_option(default_policy, base=RetryPolicy(),
                                            where="default_policy")
        #: The fields ``default_policy`` states (they override native parity, ``_options``).
        # A ``RetryPolicy`` object states every field.
        self._default_stated: dict[str, Any] = default_policy.to_dict() \
            if isinstance(default_policy, RetryPolicy) else dict(default_policy) \
            if isinstance(default_policy, Mapping) else {}
        self._default_exhaustion: str | None = self._default_stated.get("on_exhaustion")
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
        #: The replaced ``Retries``' settings, the fallback of native options (``_native``).
        self.native_defaults = STOCK
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
                default_stated=self._default_stated, native=self.native_defaults)
        return policy

    # -- declaring, sending, booting: validation (RET-16) -------------------------------------

    def before_declare_actor(self, broker: Broker, actor: Any) -> None:
        self._take_retries_slot(broker)
        first = actor.actor_name not in self._actor_policies  # this hook runs twice per actor
        self._actor_policies[actor.actor_name] = actor_policy(
            actor.options, self.default_policy, actor=actor.actor_name,
            default_stated=self._default_stated, native=self.native_defaults)
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
        self._take_retries_slot(broker)
        check_message_options(message.options, actor=message.actor_name)
        ensure_idempotency_key(message.options, actor=message.actor_name)

    def before_worker_boot(self, broker: Broker, worker: Any) -> None:
        self._take_retries_slot(broker)
        recover_delays(broker)  # Redis: retries held in memory come back after a lost link
        guard_acks(broker)  # RabbitMQ: a late ack on a new channel would ack another message
        check_store(broker, self.store_for(broker), self.logger)  # warns of per-process records
        check_prometheus(broker, self.logger)  # Dramatiq's own miscounts: OjsPrometheus

    def after_worker_boot(self, broker: Broker, worker: Any) -> None:
        # The mover takes parked retries to .DQ when they are due; it runs with parking off
        # too, so that retries parked before it was turned off are not stranded.
        if is_redis(broker):
            self.parking.start_mover(broker)

    def after_worker_shutdown(self, broker: Broker, worker: Any) -> None:
        self.parking.stop_mover(broker)

    def _take_retries_slot(self, broker: Broker) -> None:
        """Take Dramatiq's ``Retries`` slot (see this module's docstring)."""
        slots = broker.middleware
        for index, other in enumerate(slots):
            quiet_unrun(other)  # and keep Callbacks from failing a delivery stopped unrun
            if isinstance(other, Retries):
                mine = next((i for i, m in enumerate(slots) if m is self), None)
                slots[index] = self
                if mine is not None:
                    slots[mine] = _ReplacedRetries()
                self.native_defaults, lost = defaults_of(other)
                self._actor_policies.clear()  # any computed without them
                level, why = replaced_retries(self.native_defaults, lost)
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

    def dependency_of(self, actor_name: str) -> str | None:
        """The dependency an actor draws its retry budget from (``retry_budget=``)."""
        return self._actor_budgets.get(actor_name)
