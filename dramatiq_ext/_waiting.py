"""Where a Dramatiq setup keeps its waiting retries, for the console (``ojs_adapters.browse``).

- **Redis, parked** (``_parking``): the sorted set ``<ns>:_ojs.parked``, one member
  ``[<queue>.DQ, redis id, message]`` per retry longer than ``park_after``, scored
  by its ``eta``. Paged on the broker, soonest first; *retry now* moves the message
  into ``<queue>.DQ`` with its ``eta`` set to now (as the mover does when it falls
  due), *discard* removes it and marks the record discarded; one atomic step each.
- **Redis, delayed**: shorter retries sit in ``<ns>:<queue>.DQ`` (their data in
  ``.DQ.msgs``) where a worker fetches them at once and holds them until their eta:
  listed from the ``.msgs`` hashes, not actionable (a worker owns them).
- **RabbitMQ**: parked retries wait inside the delay levels' TTL queues, delayed
  ones unacked in a worker: AMQP counts the first (and the ``.DQ`` messages no
  worker took yet) and can neither list nor move them. The workers' reported
  decisions (``ojs_adapters.stats``) list them.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from dramatiq.common import dq_name, q_name
from dramatiq.message import Message

from dramatiq_ext._parking import PARKED_KEY
from dramatiq_ext._state import MessageState
from ojs_adapters.browse import (
    DECIDED,
    WaitingFilter,
    WaitingPage,
    WaitingRetry,
    WaitingSource,
    decided_page,
    decided_source,
)
from ojs_adapters.delay_levels import BITS
from ojs_adapters.history import JobRecord, iso_utc, utc_now
from ojs_adapters.runtime.parked_scan import ParkedSetScan
from ojs_adapters.stats import StatsReader

#: The actor name in an encoded message (Dramatiq's JSON: a plain name, no escapes).
_ACTOR = re.compile(r'"actor_name":\s*"([^"\\]*)"')
#: Record ``end_reason`` of a retry an operator discarded.
DISCARDED_BY_OPERATOR = "discarded by an operator"

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
                 max_attempts: Any = None) -> None:
        self.broker = broker
        self.queues = list(queues)
        self.records = records  # a RecordStore (dict records by message id)
        self.levels = levels
        self.stats = stats
        self.max_attempts = max_attempts or (lambda actor, message: None)
        self.redis = broker.client if type(broker).__name__ == "RedisBroker" else None
        self.namespace = getattr(broker, "namespace", "")
        self._move = self.redis.register_script(_MOVE_NOW) if self.redis is not None else None

    @property
    def parked_key(self) -> str:
        return f"{self.namespace}:{PARKED_KEY}"

    def sources(self) -> list[WaitingSource]:
        if self.redis is None:
            return [*self._amqp_counts(), decided_source(
                self.stats, "dramatiq", "Parked and delayed retries cannot be listed over "
                "AMQP.")]
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
        import pika
        from pika.exceptions import ChannelClosedByBroker

        parked = delayed = 0
        connection = pika.BlockingConnection(self.broker.parameters)
        try:
            names = [(f"{self.levels}_{n}", True) for n in range(BITS)]
            names += [(dq_name(q), False) for q in self.queues]
            for name, is_level in names:
                channel = connection.channel()
                try:
                    count = channel.queue_declare(name, passive=True).method.message_count
                except ChannelClosedByBroker:  # not declared: nothing waits there
                    continue
                finally:
                    if channel.is_open:
                        channel.close()
                if is_level:
                    parked += int(count)
                else:
                    delayed += int(count)
        finally:
            connection.close()
        return [
            WaitingSource("parked", "Parked in the RabbitMQ delay levels", listable=False,
                          actionable=False, count=parked,
                          note=f"Messages inside the TTL queues {self.levels}_0..27 cannot "
                               "be read or moved without consuming them."),
            WaitingSource("delayed", "In the delay queues", listable=False, actionable=False,
                          count=delayed,
                          note="Ready messages in <queue>.DQ that no worker took yet; the "
                               "ones a worker holds until due are not counted by AMQP."),
        ]

    def page(self, source: str, filters: WaitingFilter, *, page: int = 1,
             per_page: int = 50) -> WaitingPage:
        if source == DECIDED and self.stats is not None:
            return decided_page(self.stats, "dramatiq", filters, page=page, per_page=per_page)
        start = (page - 1) * per_page
        if source == "delayed" and self.redis is not None:
            found = sorted((x for x in self._delayed() if filters.matches(x)),
                           key=lambda x: x.due_at or datetime.min.replace(tzinfo=timezone.utc))
            return WaitingPage(tuple(found[start:start + per_page]), page, per_page, len(found))
        if source != "parked" or self.redis is None:
            return WaitingPage((), page, per_page, 0)
        if filters == WaitingFilter():
            with self.redis.pipeline(transaction=False) as pipe:
                pipe.zcard(self.parked_key)
                pipe.zrange(self.parked_key, start, start + per_page - 1, withscores=True)
                total, pairs = pipe.execute()
            return WaitingPage(tuple(self._parked(m, s) for m, s in pairs), page, per_page,
                               int(total))
        total, kept = 0, []
        for member, score in self._scan(_needles(filters)):
            if self._matches(member, filters):  # a light read; the page is decoded whole
                if start <= total < start + per_page:
                    kept.append(self._parked(member, score))
                total += 1
        return WaitingPage(tuple(kept), page, per_page, total)

    def retry_now(self, source: str, ids: Sequence[str]) -> int:
        if source != "parked" or self._move is None:
            return 0
        args: list[str | bytes] = [self.namespace]
        now = int(time.time() * 1000)
        for member, _score in self._members(ids):
            queue, redis_id, data = json.loads(member)
            message = Message.decode(data.encode())
            message = message.copy(options={"eta": now})
            args += [member, queue, redis_id, message.encode()]
        return int(self._move(keys=[self.parked_key], args=args)) if len(args) > 1 else 0

    def discard(self, source: str, ids: Sequence[str]) -> int:
        if source != "parked" or self.redis is None:
            return 0
        removed = 0
        for member, _score in self._members(ids):
            if self.redis.zrem(self.parked_key, member):
                removed += 1
                self._mark_discarded(self._parked(member, 0.0).id)
        return removed

    def _mark_discarded(self, job_id: str) -> None:
        data = self.records.load(job_id)
        if not data:
            return
        record = JobRecord.from_dict(data)
        record = replace(record, state="discarded", outcome="discarded", next_retry_at=None,
                         updated_at=iso_utc(utc_now()),
                         extra={**record.extra, "end_reason": DISCARDED_BY_OPERATOR})
        self.records.save(job_id, record.to_dict())

    def _matches(self, member: bytes, filters: WaitingFilter) -> bool:
        queue, _redis_id, data = json.loads(member)
        actor = _ACTOR.search(data)  # the message's own JSON: no full decode
        return filters.matches(WaitingRetry(
            "", actor.group(1) if actor else "", q_name(queue), 0, None, None, None, None,
            "parked"))

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
