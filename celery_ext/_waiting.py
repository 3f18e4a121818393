"""Where a Celery setup keeps its waiting retries, for the console (``ojs_adapters.browse``).

- **Redis, parked** (``_parking``): the sorted set ``_ojs.parked`` holds each retry
  longer than ``ojs_park_after`` as the envelope kombu would push, scored by its due
  time. Paged on the broker (``ZRANGE`` by rank: soonest first); *retry now* moves
  the envelope to its list with the ETA and ``not_before`` cleared, and *discard*
  removes it and marks the record discarded, each in one atomic step per retry.
- **Redis, held**: shorter countdowns are ETA messages a worker holds unacked until
  due; kombu keeps them in its ``unacked`` hash, which is read whole (it holds only
  what workers prefetched). Listed, not actionable: the worker owns them.
- **RabbitMQ**: parked retries wait inside the TTL queues of the delay levels and
  held ones unacked in a worker; AMQP can count the first and neither list nor
  move them. The workers' reported decisions (``ojs_adapters.stats``) list them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from celery_ext._headers import HEADER, HeaderState
from celery_ext._parking import PARKED_KEY, prefix_of
from celery_ext.records import RecordStore
from ojs_adapters.browse import (
    DECIDED,
    WaitingFilter,
    WaitingPage,
    WaitingRetry,
    WaitingSource,
    decided_page,
    decided_source,
)
from ojs_adapters.history import utc_now
from ojs_adapters.runtime.parked_scan import ParkedSetScan
from ojs_adapters.stats import StatsReader

#: Record ``end_reason`` of a retry an operator discarded.
DISCARDED_BY_OPERATOR = "discarded by an operator"
#: Number of RabbitMQ delay levels (``kombu.transport.native_delayed_delivery``).
LEVELS = 28

#: KEYS[1] the parked set; ARGV: (member, list key, new payload) triples. Each member
#: still parked is removed and its payload pushed (as kombu's ``_put``); the count moved.
_MOVE_NOW = """
local moved = 0
for i = 1, #ARGV, 3 do
  if redis.call('ZREM', KEYS[1], ARGV[i]) == 1 then
    redis.call('LPUSH', ARGV[i + 1], ARGV[i + 2])
    moved = moved + 1
  end
end
return moved
"""


class CeleryRetryView(ParkedSetScan):
    """``RetryView`` of a Celery app (see the module docstring)."""

    def __init__(self, app: Any, *, redis: Any = None, prefix: str = "",
                 stats: StatsReader | None = None) -> None:
        self.app = app
        self.redis = redis  # a plain client (keys prefixed by hand), None on RabbitMQ
        self.prefix = prefix
        self.stats = stats
        self.records = RecordStore(app.backend)
        self._move = redis.register_script(_MOVE_NOW) if redis is not None else None

    @property
    def parked_key(self) -> str:
        return self.prefix + PARKED_KEY

    def sources(self) -> list[WaitingSource]:
        if self.redis is None:
            return [self._levels(), WaitingSource(
                "held", "Held by workers", listable=False, actionable=False, count=None,
                note="Retries due within ojs_park_after (60 s) wait unacked in a worker; "
                     "AMQP can neither count nor list them."),
                decided_source(self.stats, "celery", "Parked and held retries cannot be "
                               "listed over AMQP.")]
        return [
            WaitingSource("parked", "Parked on Redis", listable=True, actionable=True,
                          count=int(self.redis.zcard(self.parked_key)),
                          note=f"The sorted set {self.parked_key!r}: retries longer than "
                               "ojs_park_after wait here and move to their queue when due."),
            WaitingSource("held", "Held by workers", listable=True, actionable=False,
                          count=sum(1 for _ in self._held()),
                          note="ETA messages a worker holds unacked until due (countdowns "
                               "up to ojs_park_after): they run when due; the worker owns "
                               "them, so they cannot be moved or dropped from here."),
        ]

    def _levels(self) -> WaitingSource:
        base = f"{prefix_of(self.app)}_celery_delayed_"
        total = 0
        with self.app.connection_for_write() as conn:
            for level in range(LEVELS):
                channel = conn.channel()
                try:
                    total += int(channel.queue_declare(
                        queue=f"{base}{level}", passive=True).message_count)
                except Exception:  # a level not declared yet holds nothing (a 404)
                    pass
                finally:
                    _close(channel)
        return WaitingSource("parked", "Parked in the RabbitMQ delay levels", listable=False,
                             actionable=False, count=total,
                             note=f"Messages inside the TTL queues {base}0..27 cannot be read "
                                  "or moved without consuming them; they reach their queue "
                                  "when due.")

    def page(self, source: str, filters: WaitingFilter, *, page: int = 1,
             per_page: int = 50) -> WaitingPage:
        if source == DECIDED and self.stats is not None:
            return decided_page(self.stats, "celery", filters, page=page, per_page=per_page)
        start = (page - 1) * per_page
        if source == "held" and self.redis is not None:
            found = sorted((x for x in self._held() if filters.matches(x)),
                           key=lambda x: x.due_at or datetime.min.replace(tzinfo=timezone.utc))
            return WaitingPage(tuple(found[start:start + per_page]), page, per_page, len(found))
        if source != "parked" or self.redis is None:
            return WaitingPage((), page, per_page, 0)
        if filters == WaitingFilter():
            with self.redis.pipeline(transaction=False) as pipe:
                pipe.zcard(self.parked_key)
                pipe.zrange(self.parked_key, start, start + per_page - 1, withscores=True)
                total, pairs = pipe.execute()
            items = tuple(self._parked(m, s) for m, s in pairs)
            return WaitingPage(items, page, per_page, int(total))
        total, kept = 0, []
        for member, score in self._scan(_needles(filters, self.prefix)):
            if self._matches(member, filters):  # a light read; the page is decoded whole
                if start <= total < start + per_page:
                    kept.append(self._parked(member, score))
                total += 1
        return WaitingPage(tuple(kept), page, per_page, total)

    def retry_now(self, source: str, ids: Sequence[str]) -> int:
        if source != "parked" or self._move is None:
            return 0
        args: list[str | bytes] = []
        for member, _score in self._members(ids):
            key, payload = _split(member)
            envelope = json.loads(payload)
            headers = envelope.get("headers") or {}
            state = HeaderState.from_headers(headers)
            headers[HEADER] = replace(state, not_before=time.time()).encode()
            headers["eta"] = None
            envelope["headers"] = headers
            args += [member, key, json.dumps(envelope)]
        return int(self._move(keys=[self.parked_key], args=args)) if args else 0

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
        record = self.records.load(job_id)
        if record is None:
            return
        self.records.save(replace(
            record, state="discarded", outcome="discarded", next_retry_at=None,
            updated_at=utc_now().isoformat(timespec="milliseconds")[:-6] + "Z",
            extra={**record.extra, "end_reason": DISCARDED_BY_OPERATOR}), force=True)

    def _matches(self, member: bytes, filters: WaitingFilter) -> bool:
        key, payload = _split(member)
        queue = key[len(self.prefix):].split("\x06\x16")[0]
        task = str((json.loads(payload).get("headers") or {}).get("task"))
        return WaitingFilter(filters.queue, filters.task).matches(WaitingRetry(
            "", task, queue, 0, None, None, None, None, "parked"))

    def _parked(self, member: bytes, score: float) -> WaitingRetry:
        key, payload = _split(member)
        envelope = json.loads(payload)
        queue = key[len(self.prefix):].split("\x06\x16")[0]
        return self._retry(envelope.get("headers") or {}, queue, score, "parked")

    def _retry(self, headers: dict[str, Any], queue: str, due: float | None,
               source: str) -> WaitingRetry:
        state = HeaderState.from_headers(headers)
        task = str(headers.get("task"))
        last = state.errors[-1] if state.errors else None
        return WaitingRetry(
            id=str(headers.get("id")), task=task, queue=queue, attempt=state.attempt,
            max_attempts=self._max_attempts(task, state),
            error_type=last.type if last else None, error_code=last.code if last else None,
            due_at=datetime.fromtimestamp(due, timezone.utc) if due else None, source=source,
            key=str(headers.get("id")) if source == "parked" else "")

    def _max_attempts(self, task: str, state: HeaderState) -> int | None:
        found = self.app.tasks.get(task)
        policy: Callable[..., Any] | None = getattr(found, "policy", None)
        if policy is None:
            return None
        try:
            return int(policy(state.policy).max_attempts)
        except Exception:  # a task of another kind, or an unreadable header policy
            return None

    def _held(self) -> Iterator[WaitingRetry]:
        """Retries a worker holds until due: kombu's ``unacked`` hash (small: prefetched only)."""
        assert self.redis is not None
        now = time.time()
        for _tag, raw in self.redis.hscan_iter(self.prefix + "unacked", count=1000):
            try:
                envelope, _exchange, routing_key = json.loads(raw)
            except (ValueError, TypeError):
                continue
            headers = envelope.get("headers") or {}
            state = HeaderState.from_headers(headers)
            if state.not_before is None or state.not_before <= now or HEADER not in headers:
                continue  # running or about to: not a waiting retry
            yield self._retry(headers, str(routing_key), state.not_before, "held")


def _split(member: bytes) -> tuple[str, bytes]:
    """``<byte length of the list key>:<list key><payload>`` (``_parking``) in two."""
    colon = member.index(b":")
    size = int(member[:colon])
    return member[colon + 1:colon + 1 + size].decode(), member[colon + 1 + size:]


def _needles(filters: WaitingFilter, prefix: str) -> list[bytes]:
    """Byte strings every matching member contains: a cheap test before decoding."""
    out = []
    if filters.queue:
        out.append(f":{prefix}{filters.queue}".encode())
    if filters.task and not any(c in filters.task for c in "*?["):
        out.append(json.dumps(filters.task).encode())
    return out


def _close(channel: Any) -> None:
    try:
        channel.close()
    except Exception:  # already closed by a 404
        return

