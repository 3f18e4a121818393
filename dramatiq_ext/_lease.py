"""A Dramatiq delivery as admission sees it (``ojs_adapters.runtime.admission``).

Dramatiq hands a message out again while its first delivery is still at work (RabbitMQ
gives back the unacked messages of a dropped connection, a delay-queue hop can be
forwarded twice, Redis maintenance re-pushes a worker it takes for dead): each delivery
takes its attempt's lease before it claims. ``TimeLimit`` is held while it waits (it
would be taken for the attempt's own timeout) but the wait counts against the limit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

from dramatiq.broker import Broker, MessageProxy
from dramatiq.middleware import TimeLimit

from dramatiq_ext._handoff import TOKEN_OPTION
from dramatiq_ext._state import MessageState
from dramatiq_ext.stores import claim
from ojs_adapters.errors import OjsBackendError
from ojs_adapters.history import JobRecord
from ojs_adapters.runtime.backend_retry import BackendRetry
from ojs_adapters.runtime.claims import AdmissionReply
from ojs_adapters.runtime.handoff import Claim, attempt_id
from ojs_adapters.runtime.leases import LeaseRenewer, lease
from ojs_adapters.runtime.tokens import new_token

#: Renews the leases of the Dramatiq deliveries this process works on (a registry).
LEASE_RENEWER = LeaseRenewer()
#: Attribute of a ``MessageProxy`` naming the holder of its attempt's lease.
LEASED = "_ojs_lease_holder"


class DeliverySeat:
    """One delivery's store calls, waits and give-back, for ``admit``."""

    def __init__(self, broker: Broker, message: MessageProxy, state: MessageState, *,
                 store: Any, backend_retry: BackendRetry, record_ttl: int, logger: Any,
                 started: float, give_back: Callable[[str], NoReturn]) -> None:
        self.broker, self.message, self.store = broker, message, store
        self.attempt = state.attempt
        self.rounds = (0, state.replay_count)  # Dramatiq has no replacements
        self.label = f"{message.actor_name}[{message.message_id}]"
        self.logger = logger
        self.key = claim_key(message, state)
        # this delivery: a retried claim whose reply was lost is still ours
        self.token = f"{token_of(message)}|{new_token()}"
        self.retry, self.ttl, self.started = backend_retry, record_ttl, started
        self.give_back: Callable[[str], NoReturn] = give_back

    def begin(self, fresh: JobRecord | None, lease_ms: int | None) -> AdmissionReply | None:
        begin = getattr(self.store, "begin", None)
        if begin is None:
            return None
        data = None if fresh is None else fresh.to_dict()
        options: dict[str, Any] = {"lease_ms": lease_ms} if lease_ms is not None else {}
        if self.attempt > 1:
            options.update(attempt=self.attempt, rounds=self.rounds)
        begun: AdmissionReply = self.retry.call(
            lambda: begin(self.key, self.token, self.ttl, self.message.message_id, data,
                          **options), operation="claim attempt")
        return begun

    def lease(self, ttl_ms: int) -> bool | None:
        taken: bool | None = self.retry.call(
            lambda: lease(self.store, self.key, self.token, ttl_ms), operation="lease attempt")
        return taken

    def load(self) -> JobRecord | None:
        """The stored record; one that is there but unreadable counts as none, as on the
        one-call path (``claims.record_of``): only a store out of reach makes admission wait."""
        try:
            data = self.retry.call(lambda: self.store.load(self.message.message_id),
                                   operation="read job record")
            return JobRecord.from_dict(data) if data else None
        except OjsBackendError:
            raise
        except Exception:
            self.logger.warning("%s: the job record is unreadable; taken as none", self.label,
                                exc_info=True)
            return None

    def claim(self) -> Claim:
        claimed: Claim = self.retry.call(
            lambda: claim(self.store, self.key, self.token, self.ttl),
            operation="claim attempt")
        return claimed

    def hold_lease(self) -> None:
        LEASE_RENEWER.hold(self.store, self.key, self.token)
        vars(self.message)[LEASED] = self.token

    def waiting(self) -> Any:
        return time_limit_held(self.broker, self.message, self.started)


def claim_step(store: Any, backend_retry: BackendRetry, message: MessageProxy,
               state: MessageState, step: str, ttl: int) -> str | None:
    """Whether this copy may take ``step`` of its attempt (``claims.claim_of``); ``None``:
    the store is out of reach."""
    key, token = claim_key(message, state, step), f"{token_of(message)}|{new_token()}"
    try:
        claimed: str = backend_retry.call(lambda: claim(store, key, token, ttl),
                                          operation="claim attempt")
    except OjsBackendError:
        return None
    return claimed


def claim_key(message: MessageProxy, state: MessageState, step: str | None = None) -> str:
    """``<message id>:<attempt>`` (``/<step>``, ``/replay<n>``): what a copy claims to run."""
    key = attempt_id(message.message_id, state.attempt)
    if step:
        key += f"/{step}"
    if state.replay_count:
        key += f"/replay{state.replay_count}"
    return key


def token_of(message: MessageProxy) -> str:
    """The token of this copy of the message ("sent": the producer's own send)."""
    return str(message.options.get(TOKEN_OPTION) or "sent")


def time_limit_ms(broker: Broker, message: MessageProxy) -> float | None:
    """The shortest ``TimeLimit`` this delivery runs under, in ms (``None``: none)."""
    actor = broker.get_actor(message.actor_name)
    limits = [message.options.get("time_limit") or actor.options.get("time_limit", m.time_limit)
              for m in _time_limits(broker)]
    found = [float(limit) for limit in limits if limit]
    return min(found) if found else None


@contextmanager
def time_limit_held(broker: Broker, message: MessageProxy, started: float) -> Iterator[None]:
    """``TimeLimit`` kept from firing in this thread while admission waits, then set again
    to what is left of the limit since ``started`` (``time.monotonic()``): the wait counts,
    as a Celery limit counts from the start of the delivery, but never ends the attempt
    (the wait ends first: ``admission.wait_limit``)."""
    time_limit_over(broker, message)
    try:
        yield
    finally:
        actor = broker.get_actor(message.actor_name)
        spent = (time.monotonic() - started) * 1000
        for limit in _time_limits(broker):
            total = message.options.get("time_limit") or actor.options.get(
                "time_limit", limit.time_limit)
            left = max(1.0, float(total) - spent)  # float: Dramatiq's inf is no limit
            limit.manager.add_timeout(threading.get_ident(), left)  # type: ignore[no-untyped-call]


def time_limit_over(broker: Broker, message: MessageProxy) -> None:
    """The actor ended: its ``TimeLimit`` stops now. Dramatiq stops it after our hooks (the
    ``Retries`` slot is last, and ``emit_after`` goes backwards), so without this a limit
    could fire into the saving of an attempt that ended in time and count it a timeout."""
    for limit in _time_limits(broker):
        limit.after_process_message(broker, message)  # type: ignore[no-untyped-call]


def _time_limits(broker: Broker) -> list[TimeLimit]:
    return [m for m in broker.middleware if isinstance(m, TimeLimit)]
