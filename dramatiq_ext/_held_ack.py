"""The ack held until a delivery's successor is on the broker and its record is stored.

Dramatiq acks a message after ``after_process_message``; ``before_ack`` runs first. A
successor (a retry, a dead-letter hop, the delivery given back) the broker did not
accept, or a final record the store did not take, is kept on the message as a
``Pending``; ``before_ack`` tries again and otherwise raises ``HandoffPending``, which
Dramatiq treats as a lost broker link: it waits 5 s and tries the ack again. So the
original is acked only after its successor is on the broker (docs/lifecycle.md).
"""

from __future__ import annotations

import logging
import time
from typing import Any, NamedTuple

from dramatiq.broker import Broker, MessageProxy
from dramatiq.errors import BrokerConnectionError
from dramatiq.middleware import MiddlewareError

from dramatiq_ext._ack_ride import rides, stash
from dramatiq_ext._alerts import dead_lettered
from dramatiq_ext._handoff import Publisher
from dramatiq_ext._records import Records
from dramatiq_ext._state import MessageState
from dramatiq_ext.stores import saves_in_order
from ojs_adapters import JobRecord
from ojs_adapters.errors import OjsBackendError
from ojs_adapters.runtime.backend_retry import count_failure
from ojs_adapters.runtime.delivery import Unpublished
from ojs_adapters.runtime.handoff import handed_off, rank_of

#: Seconds the ack waits for a record that cannot be saved (the successor, forever).
RECORD_HOLD_SECONDS = 15.0
#: Attribute of a ``MessageProxy`` holding its ``Pending`` hand-off.
PENDING = "_ojs_pending_successor"


class HandoffPending(MiddlewareError, BrokerConnectionError):
    """Holds the ack of a message whose successor the broker has not accepted yet.

    Raised from ``before_ack``: a ``MiddlewareError`` so ``emit_before`` lets it
    through, a ``BrokerConnectionError`` so ``post_process_message`` waits and tries
    the ack (and with it our ``before_ack``) again instead of acking.
    """

    def __init__(self, message: str) -> None:
        Exception.__init__(self, message)  # DramatiqError's __init__ is untyped
        self.message = message


class Pending(NamedTuple):
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


class AckGate:
    """Publishes a delivery's successor and saves its record, or keeps them for the ack."""

    def __init__(self, broker: Broker, publisher: Publisher, records: Records,
                 logger: logging.Logger) -> None:
        self.broker, self.publisher, self.records, self.logger = (
            broker, publisher, records, logger)

    def settle(self, message: MessageProxy, pending: Pending) -> bool:
        """Do what ``pending`` still needs; ``False`` (kept on the message) if it cannot yet.

        Raises ``Unpublished`` for a retry that cannot be published but by the broker
        (the caller decides again); any other such successor fails the original into
        ``.XQ`` as it came (its record keeps the history).
        """
        if pending.message is not None:
            what = "delivery given back" if pending.hand_back else "dead letter" \
                if MessageState.of(pending.message.options).dead_letter else "retry"
            try:
                self.publisher.publish(self.broker, pending.message, delay=pending.delay,
                                       headers=pending.headers, operation=f"publish {what}",
                                       keep_token=pending.hand_back)
            except OjsBackendError as error:
                self.logger.error("The %s of message %r was not accepted (%s); holding the "
                                  "ack until it is.", what, message.message_id, error.code)
                vars(message)[PENDING] = pending
                return False
            except Exception as error:  # not the broker: every try would fail alike
                vars(message).pop(PENDING, None)
                if what == "retry" and pending.record is not None:
                    raise Unpublished(error) from error
                self._as_it_came(message, pending, what, error)
                return True
            pending = pending._replace(message=None)
        if pending.record is not None and not self._save(message, pending):
            return False
        vars(message).pop(PENDING, None)
        return True

    def save_before_ack(self, message: MessageProxy, record: JobRecord) -> None:
        """Save an attempt's final record; if the store is down, hold the ack until it is
        saved: a redelivered original (its ack lost too) must know the attempt ended. On a
        ``RedisBroker`` holding the records it is saved with the ack, in one transaction
        (``_ack_ride``)."""
        if rides(self.broker, self.records.store):
            stash(message, record)
            return
        if not self.records.save(record):
            vars(message)[PENDING] = Pending(None, None, {}, record, mark=False)

    def _save(self, message: MessageProxy, pending: Pending) -> bool:
        assert pending.record is not None
        record = handed_off(pending.record) if pending.mark else pending.record
        if pending.mark and not saves_in_order(self.records.store) and \
                self._newer_attempt_started(record):
            # The successor already ran and wrote its own record: this late mark would
            # overwrite it with an older history (it lost an entry under load).
            return True
        if self.records.save(record):
            return True
        since = pending.since or time.monotonic()
        if time.monotonic() - since < RECORD_HOLD_SECONDS:
            # A redelivery must find it: hold the ack, for a while.
            vars(message)[PENDING] = pending._replace(since=since)
            return False
        count_failure("write job record", "abandoned")
        self.logger.error("Acking message %r without its job record (store down for %.0f s).",
                          message.message_id, RECORD_HOLD_SECONDS)
        return True

    def _newer_attempt_started(self, record: JobRecord) -> bool:
        """Whether the store already holds a later attempt of ``record``'s job: a read before
        the write shrinks the window for a stale overwrite to one round trip."""
        current = self.records.load(record.id)
        return current is not None and rank_of(current) > rank_of(record)

    def _as_it_came(self, message: MessageProxy, pending: Pending, what: str,
                    error: Exception) -> None:
        self.logger.error("%s[%s]: could not publish the %s (%s: %s); dead-lettering the "
                          "original as it came.", message.actor_name, message.message_id,
                          what, type(error).__name__, error, exc_info=error)
        message.fail()
        if pending.record is not None:  # the on_dead_letter hooks, as for a hop
            dead_lettered(message, MessageState.of(message.options)._replace(
                attempt=pending.record.attempt, errors=pending.record.errors))
