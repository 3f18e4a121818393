"""Where a Dramatiq setup keeps its waiting retries, for the console (``runtime.browse``).

- **Redis, parked** (``_parking``): the sorted set ``<ns>:_ojs.parked`` (members
  ``[<queue>.DQ, redis id, message]``, scored by ``eta``), paged on the broker. *Retry
  now* moves a message into ``<queue>.DQ`` with its ``eta`` now (as the mover does when
  due); *discard* removes it and marks the record discarded; one atomic step each.
- **Redis, delayed**: shorter retries in ``<ns>:<queue>.DQ``, which a worker fetches at
  once and holds until due: listed (``.DQ.msgs``), not actionable.
- **RabbitMQ, parked**: in the delay levels' TTL queues, which AMQP can count but not
  list or take from; so the worker that parks a retry also notes it (``_parked_index``,
  one round trip) in an *index* beside the job records (``<record prefix>:_ojs.parked``
  in their Redis, members as in the Redis set). *Retry now* publishes a copy (a fresh
  ``ojs_token``, no ``eta``) to the queue; the parked original, when due, finds its
  attempt claimed by the copy and is dropped unrun as a duplicate (``judge_delivery``),
  counting no attempt. *Discard* claims the attempt for the operator and marks the
  record discarded: the original is dropped the same way. With records not in Redis
  (no index) the workers' reported decisions list them. **Delayed**: counted, unlisted.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from dramatiq.common import dq_name, q_name
from dramatiq.message import Message

from dramatiq_ext._handoff import TOKEN_OPTION
from dramatiq_ext._parked_index import Index, index_of, index_parked
from dramatiq_ext._parking import PARKED_KEY
from dramatiq_ext._state import MessageState
from dramatiq_ext.stores import claim
from ojs_adapters.history import JobRecord, iso_utc, utc_now
from ojs_adapters.runtime import browse, raw_fields
from ojs_adapters.runtime.browse import WaitingFilter, WaitingPage, WaitingRetry, WaitingSource
from ojs_adapters.runtime.delay_levels import BITS
from ojs_adapters.runtime.handoff import HEADER_NAMES, attempt_id
from ojs_adapters.runtime.parked_scan import ParkedSetScan, memory_page
from ojs_adapters.runtime.stats import StatsReader

# ``Index``, ``index_of`` and ``index_parked`` live in ``_parked_index`` (``_handoff`` notes
# parked retries there); kept importable from here.
__all__ = ["DISCARDED_BY_OPERATOR", "DISCARD_CLAIM", "DramatiqRetryView", "Index", "index_of",
           "index_parked"]

#: Record ``end_reason`` of a retry an operator discarded.
DISCARDED_BY_OPERATOR = "discarded by an operator"
#: The claim an operator's *discard* takes on the attempt (``<copy>|<delivery>``).
DISCARD_CLAIM = "discarded-by-operator|console"

#: KEYS[1] the parked set; ARGV[1] the namespace, then (member, queue, redis id, data)
#: quadruples: each member still parked is removed and enqueued on its queue as
#: dispatch.lua's ``enqueue`` does. Returns how many moved.
_MOVE_NOW = """
local moved = 0
for i = 2, #ARGV, 4 do
  if redis.call('ZREM', KEYS[1], ARGV[i]) == 1 then
    local queue = ARGV[1] .. ':' .. ARGV[i + 1]
    redis.call('HSET', queue .. '.msgs', ARGV[i + 2], ARGV[i + 3])
    redis.call('RPUSH', queue, ARGV[i + 2])
    moved = moved + 1
  end
end
return moved
"""


class DramatiqRetryView(ParkedSetScan):
    """``RetryView`` of a Dramatiq broker (see the module docstring)."""

    def __init__(self, broker: Any, queues: Sequence[str], records: Any, *,
                 levels: str = "ojs_dramatiq_delayed", stats: StatsReader | None = None,
                 max_attempts: Any = None, channel: Callable[[], Any] | None = None,
                 sizes: Callable[[list[str]], dict[str, int]] = lambda names: {}) -> None:
        self.broker, self.queues, self.records = broker, list(queues), records
        self.levels, self.stats = levels, stats
        self.channel, self.sizes = channel, sizes  # RabbitMQ: a new channel; queue sizes
        self.max_attempts = max_attempts or (lambda actor, message: None)
        self.amqp = type(broker).__name__ != "RedisBroker"
        self.index = index_of(records) if self.amqp else None
        # the parked set's client: the broker's, or the index's (None: neither)
        self.redis = broker.client if not self.amqp else self.index and self.index.client
        self.namespace = getattr(broker, "namespace", "")
        self._move = None if self.amqp else self.redis.register_script(_MOVE_NOW)

    @property
    def parked_key(self) -> str:
        return self.index.key if self.index else f"{self.namespace}:{PARKED_KEY}"

    def sources(self) -> list[WaitingSource]:
        if self.amqp:
            return [*self._amqp_counts(), browse.decided_source(
                self.stats, "dramatiq", "Delayed retries cannot be listed over AMQP.")]
        return [
            WaitingSource("parked", "Parked on Redis", listable=True, actionable=True,
                          count=int(self.redis.zcard(self.parked_key)),
                          note=f"The sorted set {self.parked_key!r}: retries longer than "
                               "park_after wait here and move to <queue>.DQ when due."),
            WaitingSource("delayed", "In the delay queues", listable=True, actionable=False,
                          count=sum(int(self.redis.hlen(self._dq(q) + ".msgs"))
                                    for q in self.queues),
                          note="Retries up to park_after in <queue>.DQ: a worker fetches "
                               "them at once and holds them until due, so they cannot be "
                               "moved or dropped from here."),
        ]

    def _amqp_counts(self) -> list[WaitingSource]:
        levels = [f"{self.levels}_{n}" for n in range(BITS)]
        sizes = self.sizes(levels + [dq_name(q) for q in self.queues])
        counts = {True: 0, False: 0}  # in the levels, in the .DQ queues
        for name, size in sizes.items():
            counts[name in levels] += size
        where = f"the TTL queues {self.levels}_0..27 ({counts[True]} messages)"
        parked = WaitingSource(
            "parked", "Parked in the RabbitMQ delay levels", listable=False, actionable=False,
            count=counts[True], note=f"Messages in {where} cannot be read or moved without "
            "consuming them, and with records not in Redis the workers keep no index of them.")
        return [self._indexed(parked, where, "beside the job records"), WaitingSource(
            "delayed", "In the delay queues", listable=False, actionable=False,
            count=counts[False], note="Ready messages in <queue>.DQ that no worker took yet; "
            "the ones a worker holds until due are not counted by AMQP.")]

    def page(self, source: str, filters: WaitingFilter, *, page: int = 1,
             per_page: int = 50) -> WaitingPage:
        if source == browse.DECIDED and self.stats is not None:
            return browse.decided_page(self.stats, "dramatiq", filters, page=page,
                                       per_page=per_page)
        if source == "delayed" and not self.amqp:
            return memory_page(self._delayed(), filters, page=page, per_page=per_page)
        if source != "parked" or self.redis is None:
            return WaitingPage((), page, per_page, 0)
        return self._parked_page(filters, _needles(filters), page=page, per_page=per_page)

    def retry_now(self, source: str, ids: Sequence[str]) -> int:
        if source != "parked" or self.redis is None:
            return 0
        self._forget(ids)
        if self.amqp:
            return len(self._act(ids, self._publish_copy))
        args: list[str | bytes] = [self.namespace]
        now = int(time.time() * 1000)
        for member, _score in self._members(ids):
            queue, redis_id, data = json.loads(member)
            message = Message.decode(data.encode()).copy(options={"eta": now})
            args += [member, queue, redis_id, message.encode()]
        return int(self._move(keys=[self.parked_key], args=args)) if len(args) > 1 else 0  # type: ignore[misc]

    def discard(self, source: str, ids: Sequence[str]) -> int:
        if source != "parked" or self.redis is None:
            return 0
        self._forget(ids)
        done = self._act(ids, self._claim_for_operator if self.amqp else lambda m, s: True)
        for member in done:
            self._mark_discarded(self._parked(member, 0.0).id)
        return len(done)

    def _publish_copy(self, member: bytes, _due: float) -> bool:
        """A copy of a RabbitMQ parked retry, due now, on its queue (see the docstring)."""
        import pika

        assert self.index is not None
        message, key = self._attempt(member)
        if self.index.client.exists(self.index.claim_key(key)):
            return False  # the attempt ran (or runs) already: nothing to hurry
        options = {k: v for k, v in message.options.items() if k != "eta"}
        copy = replace(message, queue_name=q_name(message.queue_name),
                       options={**options, TOKEN_OPTION: uuid.uuid4().hex})
        headers = {k: options[k] for k in HEADER_NAMES if options.get(k) is not None}
        assert self.channel is not None
        channel = self.channel()
        try:
            channel.confirm_delivery()
            channel.basic_publish(  # raises on a nack or a return (mandatory)
                exchange="", routing_key=copy.queue_name, body=copy.encode(), mandatory=True,
                properties=pika.BasicProperties(delivery_mode=2, headers=headers,
                                                priority=options.get("broker_priority")))
        finally:
            if channel.is_open:
                channel.close()
        return True

    def _claim_for_operator(self, member: bytes, due: float) -> bool:
        """Claim the attempt for the discard: the parked original is dropped when due."""
        ttl = int(max(getattr(self.records, "ttl", 0), (due - time.time() + 3600) * 1000))
        return claim(self.records, self._attempt(member)[1], DISCARD_CLAIM, ttl) == "new"

    def _attempt(self, member: bytes) -> tuple[Message[Any], str]:
        """A member's message and the claim key of the attempt it runs (``middleware``)."""
        message = Message.decode(json.loads(member)[2].encode())
        state = MessageState.of(message.options)
        key = attempt_id(message.message_id, state.attempt)
        return message, f"{key}/replay{state.replay_count}" if state.replay_count else key

    def _forget(self, ids: Sequence[str]) -> None:
        if self.stats is not None:  # no longer waiting: off the reported list too
            self.stats.forget("dramatiq", ids)

    def _mark_discarded(self, job_id: str) -> None:
        if data := self.records.load(job_id):
            record = JobRecord.from_dict(data)
            self.records.save(job_id, replace(
                record, state="discarded", outcome="discarded", next_retry_at=None,
                updated_at=iso_utc(utc_now()),
                extra={**record.extra, "end_reason": DISCARDED_BY_OPERATOR}).to_dict())

    def _matches(self, member: bytes, filters: WaitingFilter) -> bool:
        end = member.find(b'"', 2)  # the first item, the .DQ queue, and the actor: raw
        queue = member[2:end].decode() if b"\\" not in member[:end] else None
        actor = raw_fields.raw_string(member, b"actor_name", escaped=True)
        if queue is None or actor is None:
            queue, _redis_id, data = json.loads(member)
            actor = str(json.loads(data).get("actor_name"))
        return filters.matches(WaitingRetry(
            "", actor, q_name(queue), 0, None, None, None, None, "parked"))

    def _parked(self, member: bytes, score: float) -> WaitingRetry:
        queue, _redis_id, data = json.loads(member)
        return self._retry(Message.decode(data.encode()), q_name(queue), score, "parked")

    def _retry(self, message: Message[Any], queue: str, due: float,
               source: str) -> WaitingRetry:
        state = MessageState.of(message.options)
        last = state.errors[-1] if state.errors else None
        return WaitingRetry(
            id=message.message_id, task=message.actor_name, queue=queue, attempt=state.attempt,
            max_attempts=self.max_attempts(message.actor_name, message),
            error_type=last.type if last else None, error_code=last.code if last else None,
            due_at=datetime.fromtimestamp(due, timezone.utc), source=source,
            key=message.message_id if source == "parked" else "")

    def _delayed(self) -> Iterator[WaitingRetry]:
        """The messages of every ``<queue>.DQ`` (small: what workers hold and are due soon)."""
        assert self.redis is not None
        for queue in self.queues:
            for _redis_id, data in self.redis.hscan_iter(self._dq(queue) + ".msgs", count=1000):
                message = Message.decode(data)
                eta = message.options.get("eta")
                due = float(eta) / 1000 if isinstance(eta, (int, float)) else time.time()
                yield self._retry(message, queue, due, "delayed")

    def _dq(self, queue: str) -> str:
        return f"{self.namespace}:{dq_name(queue)}"


def _needles(filters: WaitingFilter) -> list[bytes]:
    out = []
    if filters.queue:
        out.append(json.dumps(dq_name(filters.queue)).encode())
    if filters.task and not any(c in filters.task for c in "*?["):
        out.append(json.dumps(filters.task)[1:-1].encode())
    return out
