"""Where a Celery setup keeps its waiting retries, for the console (``runtime.browse``).

- **Redis, parked** (``_parking``): the sorted set ``_ojs.parked``, scored by due time,
  paged on the broker. *Retry now* moves an envelope to its list with the ETA and
  ``not_before`` cleared; *discard* removes it and marks the record discarded.
- **Redis, held**: ETA messages a worker holds unacked (kombu's ``unacked`` hash, read
  whole: only what was prefetched). Listed, not actionable: the worker owns them.
- **RabbitMQ, parked**: in the delay levels' TTL queues, which AMQP can count but not
  list or take from; so the worker that parks a retry also notes it (``_parked_index``,
  one round trip) in an *index*: the sorted set ``<result key prefix>_ojs.parked`` on
  the Redis result backend, members as in the Redis set. *Retry now* publishes a copy
  (same body and headers, a fresh ``ojs-token``, due now) to the queue; the parked
  original, when due, finds its attempt claimed by the copy and is dropped unrun as a
  duplicate (``judge_delivery``), counting no attempt. *Discard* claims the attempt
  for the operator and marks the record discarded: the original is dropped the same
  way. With no Redis result backend (no index, no claims) the workers' reported
  decisions list them. **Held**: unacked in a worker, neither counted nor listed.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from celery_ext._handoff import (
    TOKEN_HEADER,
    claim_key,
    new_token,
    replaced_round,
    replay_round,
)
from celery_ext._headers import HEADER, HeaderState
from celery_ext._parked_index import COPIED_PROPERTIES, index_key, index_parked
from celery_ext._parking import PARKED_KEY, prefix_of
from celery_ext.records import CLAIM_SUFFIX, RecordStore
from ojs_adapters.history import utc_now
from ojs_adapters.runtime import browse, raw_fields
from ojs_adapters.runtime.browse import WaitingFilter, WaitingPage, WaitingRetry, WaitingSource
from ojs_adapters.runtime.parked_scan import ParkedSetScan, memory_page
from ojs_adapters.runtime.stats import StatsReader

# ``index_parked`` and ``index_key`` live in ``_parked_index`` (``_parking`` notes parked
# retries there); kept importable from here.
__all__ = ["DISCARDED_BY_OPERATOR", "DISCARD_CLAIM", "CeleryRetryView", "index_key",
           "index_parked"]

#: Record ``end_reason`` of a retry an operator discarded.
DISCARDED_BY_OPERATOR = "discarded by an operator"
#: The claim an operator's *discard* takes on the attempt (``<copy>|<delivery>``).
DISCARD_CLAIM = "discarded-by-operator|console"

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
                 stats: StatsReader | None = None,
                 count_levels: Callable[[], int | None] = lambda: None) -> None:
        self.app, self.amqp, self.prefix, self.stats = app, redis is None, prefix, stats
        self.count_levels = count_levels  # messages in the RabbitMQ delay levels
        self.index = index_key(app) if self.amqp else None
        # the parked set's client (keys prefixed by hand): the broker's, or the index's
        self.redis = app.backend.client if self.index is not None else redis
        self.records = RecordStore(app.backend)
        self._move = redis.register_script(_MOVE_NOW) if redis is not None else None

    @property
    def parked_key(self) -> Any:
        return self.index if self.amqp else self.prefix + PARKED_KEY

    def sources(self) -> list[WaitingSource]:
        if not self.amqp:
            return [
                WaitingSource("parked", "Parked on Redis", listable=True, actionable=True,
                              count=int(self.redis.zcard(self.parked_key)),
                              note=f"The sorted set {self.parked_key!r}: retries longer than "
                                   "ojs_park_after wait here and move to their queue when due."),
                WaitingSource("held", "Held by workers", listable=True, actionable=False,
                              count=sum(1 for _ in self._held()),
                              note="ETA messages a worker holds unacked until due (countdowns "
                                   "up to ojs_park_after): they run when due; the worker owns "
                                   "them, so they cannot be moved or dropped from here.")]
        levels = self.count_levels()
        where = f"the TTL queues {prefix_of(self.app)}_celery_delayed_0..27 ({levels} messages)"
        parked = WaitingSource(
            "parked", "Parked in the RabbitMQ delay levels", listable=False, actionable=False,
            count=levels, note=f"Messages in {where} cannot be read or moved without consuming "
            "them, and with no Redis result backend the workers keep no index of them.")
        return [self._indexed(parked, where, "on the result backend"), WaitingSource(
            "held", "Held by workers", listable=False, actionable=False, count=None,
            note="Retries due within ojs_park_after (60 s) wait unacked in a worker; AMQP can "
                 "neither count nor list them."), browse.decided_source(
            self.stats, "celery", "Held retries cannot be listed over AMQP.")]

    def page(self, source: str, filters: WaitingFilter, *, page: int = 1,
             per_page: int = 50) -> WaitingPage:
        if source == browse.DECIDED and self.stats is not None:
            return browse.decided_page(self.stats, "celery", filters, page=page,
                                       per_page=per_page)
        if source == "held" and not self.amqp:
            return memory_page(self._held(), filters, page=page, per_page=per_page)
        if source != "parked" or self.redis is None:
            return WaitingPage((), page, per_page, 0)
        return self._parked_page(filters, _needles(filters, self.prefix), page=page,
                                 per_page=per_page)

    def retry_now(self, source: str, ids: Sequence[str]) -> int:
        if source != "parked" or self.redis is None:
            return 0
        self._forget(ids)
        if self.amqp:
            return len(self._act(ids, self._publish_copy))
        args: list[str | bytes] = []
        for member, _score in self._members(ids):
            key, payload = _split(member)
            envelope = json.loads(payload)
            envelope["headers"] = _due_now(envelope.get("headers") or {})
            args += [member, key, json.dumps(envelope)]
        return int(self._move(keys=[self.parked_key], args=args)) if args else 0  # type: ignore[misc]

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
        queue, payload = _split(member)
        envelope = json.loads(payload)
        headers = envelope.get("headers") or {}
        if self.redis.exists(self._claim_name(headers)):
            return False  # the attempt ran (or runs) already: nothing to hurry
        properties = envelope.get("properties") or {}
        with self.app.connection_for_write(transport_options={"confirm_publish": True}) as conn:
            conn.Producer().publish(
                base64.b64decode(envelope["body"]), exchange="", routing_key=queue,
                content_type=envelope.get("content-type"),
                content_encoding=envelope.get("content-encoding"),
                headers={**_due_now(headers), TOKEN_HEADER: new_token()}, retry=False,
                **{k: properties[k] for k in COPIED_PROPERTIES if k in properties})
        return True

    def _claim_for_operator(self, member: bytes, due: float) -> bool:
        """Claim the attempt for the discard: the parked original is dropped when due."""
        headers = json.loads(_split(member)[1]).get("headers") or {}
        ttl = max(self.records._claim_ttl(), due - time.time() + 3600)
        return bool(self.redis.set(self._claim_name(headers), DISCARD_CLAIM, nx=True,
                                   ex=int(ttl)))

    def _claim_name(self, headers: dict[str, Any]) -> Any:
        """The Redis key of the claim on the attempt these headers run (``_attempt``)."""
        key = claim_key(str(headers.get("id")), HeaderState.from_headers(headers).attempt,
                        replays=replay_round(headers),
                        replaced=replaced_round(headers.get("replaced_task_nesting")))
        return self.app.backend.get_key_for_task(key, key=CLAIM_SUFFIX)

    def _forget(self, ids: Sequence[str]) -> None:
        if self.stats is not None:  # no longer waiting: off the reported list too
            self.stats.forget("celery", ids)

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
        if filters.queue is not None and queue != filters.queue:
            return False
        task = raw_fields.raw_string(payload, b"task")  # no decoding where the bytes say it
        if task is None:
            task = str((json.loads(payload).get("headers") or {}).get("task"))
        return WaitingFilter(task=filters.task).matches(WaitingRetry(
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


def _due_now(headers: dict[str, Any]) -> dict[str, Any]:
    """``headers`` of a retry made due now: ``not_before`` now, no ETA."""
    state = HeaderState.from_headers(headers)
    return {**headers, HEADER: replace(state, not_before=time.time()).encode(), "eta": None}


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
