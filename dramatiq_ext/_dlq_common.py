"""What ``dlq`` and its broker stores (``_dlq_stub``, ``_dlq_redis``, ``_dlq_rabbitmq``) share.

The ``DeadLetter`` a dead Dramatiq message stands for (``dead_letter_of``), the
copy a replay sends (``replay_message``), and where a replay is stamped on the job
record (``JobRecords``). See ``dlq`` for how replay works.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone
from typing import Any

from dramatiq.broker import Broker
from dramatiq.common import q_name
from dramatiq.message import Message

from dramatiq_ext._ended import FAILURE_OPTION
from dramatiq_ext._handoff import TOKEN_OPTION
from dramatiq_ext._state import STATE_OPTION, MessageState
from dramatiq_ext.middleware import OjsRetries
from dramatiq_ext.stores import MemoryRecordStore, RecordStore, default_store
from ojs_adapters import JobRecord, OjsValidationError
from ojs_adapters.runtime.dlq import (
    DeadLetter,
    ReplayMark,
    closed_round,
    last_error,
    replayed_record,
)
from ojs_adapters.runtime.handoff import HEADER_NAMES

#: Options that belong to one hop through a broker (and the hand-off's: the last
#: failure's ``x-ojs-*``, the copy's token, the dead letter's error for ``Results``),
#: dropped from a replayed copy.
_HOP_OPTIONS = frozenset({"eta", "redis_message_id", TOKEN_OPTION, FAILURE_OPTION,
                          *HEADER_NAMES})


def dead_letter_of(message: Message[Any], *, key: str,
                   at: datetime | None = None) -> DeadLetter:
    """The ``DeadLetter`` a dead Dramatiq message stands for.

    ``at`` is when the broker dead-lettered it; without it, when the last error
    happened (the dead-letter decision), else when the job was first sent.
    """
    state = MessageState.of(message.options)
    error_type, error_code = last_error(state.errors)
    fallback = _fallback_time(message, state)
    return DeadLetter(
        id=message.message_id, queue=q_name(message.queue_name), task_type=message.actor_name,
        error_type=error_type, error_code=error_code,
        # max: RabbitMQ's x-death time has whole seconds only, the last error ms.
        dead_lettered_at=max(at, fallback) if at else fallback, attempt=state.attempt,
        history=state.errors, payload=message.asdict(), replay_count=state.replay_count,
        last_replayed_at=state.last_replayed_at, key=key)


#: Characters of an undecodable dead message's text kept in its listing.
UNDECODABLE_TEXT = 10_000


def decoded(raw: bytes) -> Message[Any] | None:
    """The Dramatiq message in ``raw``; ``None`` for bytes that hold none (another
    producer's message, which Dramatiq's consumer rejects into ``.XQ`` as it is)."""
    try:
        return Message.decode(raw)
    except Exception:  # Dramatiq's DecodeError, or what its encoder raises on odd input
        return None


def undecodable_letter(raw: bytes, *, queue: str, key: str, at: datetime | None) -> DeadLetter:
    """A dead message Dramatiq cannot decode, listed with its text (id: its ``key``) so that
    it can be seen and deleted; a replay skips it, having no job to send."""
    return DeadLetter(id=key, queue=queue, task_type="", error_type=None,
                      dead_lettered_at=at or datetime.now(timezone.utc), attempt=0,
                      payload={"undecodable_body": raw.decode("utf-8", "replace")[
                          :UNDECODABLE_TEXT]}, key=key)


def replay_message(message: Message[Any], mark: ReplayMark) -> Message[Any]:
    """The copy of a dead message that a replay sends: attempt 1, history kept (its dead
    round stamped), mark set."""
    state = MessageState.of(message.options)
    fresh = MessageState(1, closed_round(state.errors, mark.replay_count - 1),
                         replay_count=mark.replay_count,
                         last_replayed_at=mark.replayed_at)
    options = {k: v for k, v in message.options.items() if k not in _HOP_OPTIONS}
    options[STATE_OPTION] = fresh.to_option()
    return dataclasses.replace(message, queue_name=q_name(message.queue_name), options=options)


class JobRecords:
    """Stamps replays on job records, in the store the workers use.

    That is ``store`` if given, else the broker's ``OjsRetries`` store, else the
    default one for the broker. A worker that finds a job's record terminal at
    the replayed attempt drops the copy as a duplicate, so a replay refuses to
    run when the records are out of reach: process memory of a broker that
    other processes consume (a RabbitMQ URL without ``Results``).
    """

    def __init__(self, broker: Broker, store: RecordStore | None = None) -> None:
        ojs = next((m for m in broker.middleware if isinstance(m, OjsRetries)), None)
        self.store: RecordStore = store or (ojs.store_for(broker) if ojs else
                                            default_store(broker))
        self.reachable = not isinstance(self.store, MemoryRecordStore) or \
            type(broker).__name__ == "StubBroker"

    def mark(self, letter: DeadLetter, mark: ReplayMark) -> None:
        """Record that ``letter`` is being replayed (before it moves: see ``runtime.dlq``)."""
        if not self.reachable:
            raise OjsValidationError(
                "replay needs the workers' job records: open the dead letters with "
                "--app module:broker (the workers' broker), or --option records=REDIS_URL "
                "[--option records_prefix=P] for a RedisRecordStore",
                code="INVALID_ARGS",
                details={"field": "app", "rule": "the workers' job records are reachable"})
        data = self.store.load(letter.id)
        record = JobRecord.from_dict(data) if data else JobRecord(
            id=letter.id, type=letter.task_type, queue=letter.queue,
            max_attempts=letter.attempt, attempt=letter.attempt, errors=letter.history)
        self.store.save(letter.id, replayed_record(record, mark).to_dict())


def _fallback_time(message: Message[Any], state: MessageState) -> datetime:
    if state.errors and state.errors[-1].occurred_at:
        return datetime.fromisoformat(state.errors[-1].occurred_at.replace("Z", "+00:00"))
    return datetime.fromtimestamp(message.message_timestamp / 1000, timezone.utc)
