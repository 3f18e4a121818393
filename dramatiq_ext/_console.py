"""The console's view of a Dramatiq broker (``ojs_adapters.runtime.browse``): entry point
``ojs_adapters.console``.

Dead letters come from ``dramatiq_ext.dlq`` (the ``ojs-retry dlq`` API, which
replays and deletes). On Redis, pages are read on the broker: each ``<ns>:<q>.XQ``
is a sorted set scored by dead-lettering time (ms), so the date filter is a score
range, counts are ``ZCOUNT``, a page merges the queues' id ranges by score and
decodes only its own messages (``HMGET``). A filter on actor or error type reads
the queues in chunks of ``CHUNK``, tests each raw message for the filter's literal
text first, and decodes only what may match (``_raw_filter``). On RabbitMQ a queue cannot be read
without taking it: pages come from the ``DeadLetters`` listing, depths from a
passive declare.
"""

from __future__ import annotations

import heapq
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from dramatiq.common import xq_name
from dramatiq.message import Message

from dramatiq_ext._dlq_common import decoded, undecodable_letter
from dramatiq_ext._dlq_redis import RedisDeadLetters
from dramatiq_ext._options import KEY_OPTION
from dramatiq_ext._quiet_404 import NOT_FOUND, NotFoundQuiet
from dramatiq_ext._raw_filter import passes
from dramatiq_ext._state import STATE_OPTION
from dramatiq_ext._waiting import DramatiqRetryView
from dramatiq_ext.dlq import dead_letter_of, open_dead_letter_queue
from dramatiq_ext.middleware import OjsRetries
from ojs_adapters.history import JobRecord
from ojs_adapters.runtime.browse import LetterDetails
from ojs_adapters.runtime.dlq import DeadLetter, DeadLetterFilter, DeadLetters, Page
from ojs_adapters.runtime.raw_fields import needles as raw_needles
from ojs_adapters.runtime.stats import StatsReader

#: Messages read per round trip while filtering.
CHUNK = 500


def _is_rabbitmq(store: object) -> bool:
    """Whether ``store`` is the RabbitMQ dead-letter store, looked up rather than imported:
    its module needs pika, which a Redis setup's extras do not install."""
    module = sys.modules.get("dramatiq_ext._dlq_rabbitmq")
    return module is not None and isinstance(store, module.RabbitmqDeadLetters)


class DramatiqConsole:
    """``ConsoleBackend`` of a Dramatiq broker (see the module docstring)."""

    framework = "dramatiq"

    def __init__(self, dead_letters: DeadLetters) -> None:
        self.dead_letters = dead_letters
        store: Any = dead_letters.store
        self.broker: Any = store.broker
        self.records: Any = store.records.store
        self._redis = store if isinstance(store, RedisDeadLetters) else None
        self._amqp = store if _is_rabbitmq(store) else None

    def retry_view(self, stats: StatsReader | None) -> DramatiqRetryView:
        ojs = next((m for m in self.broker.middleware if isinstance(m, OjsRetries)), None)
        levels = ojs.parking.levels.base if ojs is not None else "ojs_dramatiq_delayed"
        return DramatiqRetryView(
            self.broker, self.dead_letters.queues(), self.records, levels=levels, stats=stats,
            max_attempts=self._max_attempts, channel=self._amqp._open if self._amqp else None,
            sizes=self._sizes)

    def _max_attempts(self, actor: str, message: Any) -> int | None:
        ojs = next((m for m in self.broker.middleware if isinstance(m, OjsRetries)), None)
        if ojs is None or actor not in self.broker.actors:
            return None
        try:
            return int(ojs._policy(self.broker, message).max_attempts)
        except Exception:  # an actor of another broker, an unreadable message policy
            return None

    def record(self, job_id: str) -> JobRecord | None:
        data = self.records.load(job_id)
        return JobRecord.from_dict(data) if data else None

    def stats_client(self) -> Any | None:
        if self._redis is not None:
            return self._redis.client
        records = getattr(self.records, "client", None)  # a RedisRecordStore's Redis
        if hasattr(records, "hgetall"):
            return records
        try:
            backend = self.broker.get_results_backend()
        except RuntimeError:
            return None
        client = getattr(backend, "client", None)
        return client if hasattr(client, "hgetall") else None

    def close(self) -> None:
        self.dead_letters.close()

    # -- dead letters ---------------------------------------------------------------

    def describe(self, letter: DeadLetter) -> LetterDetails:
        payload = dict(letter.payload)
        options = dict(payload.get("options") or {})
        policy = None
        ojs = next((m for m in self.broker.middleware if isinstance(m, OjsRetries)), None)
        if ojs is not None and letter.task_type in self.broker.actors:
            try:
                message: Any = Message(**payload)  # read like a delivery's proxy
                policy = ojs._policy(self.broker, message).to_dict()
            except Exception:  # an unreadable message policy: show none rather than guess
                policy = None
        shown = {k: v for k, v in options.items() if k != STATE_OPTION}
        key = options.get(KEY_OPTION)
        return LetterDetails(shown, policy, str(key) if key is not None else None,
                             {"args": payload.get("args"), "kwargs": payload.get("kwargs")})

    def depths(self) -> dict[str, int]:
        queues = self.dead_letters.queues()
        if self._redis is not None:
            with self._redis.client.pipeline(transaction=False) as pipe:
                for queue in queues:
                    pipe.zcard(self._key(queue))
                return dict(zip(queues, (int(n) for n in pipe.execute()), strict=True))
        if self._amqp is None:  # the stub broker
            return {q: self.dead_letters.list(DeadLetterFilter(queue=q)).total for q in queues}
        sizes = self._sizes([xq_name(q) for q in queues])
        return {q: sizes.get(xq_name(q), 0) for q in queues}  # no .XQ yet: none dead

    def _sizes(self, names: list[str]) -> dict[str, int]:
        """Messages in each of the RabbitMQ queues ``names`` that exists, by passive
        declares (nothing is taken); a queue not declared is an answer here, not a
        warning (``NotFoundQuiet``), any other refusal is raised."""
        from pika.exceptions import ChannelClosedByBroker

        out: dict[str, int] = {}
        channel = None  # one channel, until a 404 closes it
        with NotFoundQuiet():
            for name in names:
                assert self._amqp is not None
                if channel is None or not channel.is_open:
                    channel = self._amqp._open()
                try:
                    declared = channel.queue_declare(name, passive=True)
                except ChannelClosedByBroker as exc:
                    if exc.reply_code != NOT_FOUND:
                        raise
                    continue  # not declared: none dead yet
                out[name] = int(declared.method.message_count)
        if channel is not None and channel.is_open:
            channel.close()
        return out

    def letters(self, filters: DeadLetterFilter, *, page: int = 1, per_page: int = 50) -> Page:
        if self._redis is None:
            return self.dead_letters.list(filters, page=page, per_page=per_page)
        queues = [filters.queue] if filters.queue else self.dead_letters.queues()
        low, high = _bound(filters.since, "-inf"), _bound(filters.until, "+inf", exclusive=True)
        start = (page - 1) * per_page
        if filters.task_type is None and filters.error_type is None and filters.ids is None:
            with self._redis.client.pipeline(transaction=False) as pipe:
                for queue in queues:
                    pipe.zcount(self._key(queue), low, high)
                    pipe.zrangebyscore(self._key(queue), low, high, start=0,
                                       num=start + per_page, withscores=True)
                found = pipe.execute()
            total = sum(int(n) for n in found[0::2])
            ranked = heapq.merge(*([(s, _text(k), q) for k, s in pairs]
                                   for q, pairs in zip(queues, found[1::2], strict=True)))
            chosen = list(ranked)[start:start + per_page]
            return Page(tuple(self._decode(chosen)), page, per_page, total)
        needles, rest = raw_needles(filters), DeadLetterFilter(
            task_type=filters.task_type, error_type=filters.error_type, ids=filters.ids)
        client, matched, total = self._redis.client, [], 0
        for queue in queues:  # ids (no scores: each costs a parse) and raw messages
            kept, offset = [], 0
            while True:
                ids = client.zrangebyscore(self._key(queue), low, high, start=offset, num=CHUNK)
                datas = client.hmget(self._key(queue) + ".msgs", ids) if ids else []
                kept += [k for k, data in zip(ids, datas, strict=True) if data is not None
                         and all(n in data for n in needles) and passes(data, rest)]
                if len(ids) < CHUNK:
                    break
                offset += CHUNK
            matched.append((queue, kept[:start + per_page]))
            total += len(kept)
        with client.pipeline(transaction=False) as pipe:  # scores of what may be shown
            for queue, kept in matched:
                for key in kept:
                    pipe.zscore(self._key(queue), key)
            scores = iter(pipe.execute())
        lists = [[(score, _text(k), q) for k in kept if (score := next(scores)) is not None]
                 for q, kept in matched]
        chosen = list(heapq.merge(*lists))[start:start + per_page]
        return Page(tuple(self._decode(chosen)), page, per_page, total)

    def letter(self, job_id: str, queue: str | None = None,
               key: str | None = None) -> DeadLetter | None:
        if self._redis is None:
            return self.dead_letters.show(job_id)
        client = self._redis.client
        found: list[DeadLetter] = []
        for name in [queue] if queue else self.dead_letters.queues():
            if key:  # the listing's handle: one read
                pairs: Any = [(key, client.hget(self._key(name) + ".msgs", key))]
            else:  # HSCAN cannot match values: read the hash a chunk at a time
                pairs = client.hscan_iter(self._key(name) + ".msgs", count=CHUNK)
            for redis_id, data in pairs:
                own = _text(redis_id) == job_id  # an undecodable one is listed by its key
                if data is None or not (own or job_id.encode() in data):
                    continue
                message = decoded(data)
                if message is None:
                    if own:
                        found.append(undecodable_letter(data, queue=name, key=job_id, at=None))
                elif message.message_id == job_id:
                    score = client.zscore(self._key(name), redis_id)
                    at = datetime.fromtimestamp(score / 1000, timezone.utc) if score else None
                    found.append(dead_letter_of(message, key=_text(redis_id), at=at))
        return max(found, key=lambda x: x.dead_lettered_at) if found else None

    def _key(self, queue: str) -> str:
        assert self._redis is not None
        return self._redis._key(queue, ".XQ")

    def _decode(self, chosen: Sequence[tuple[float, str, str]]) -> list[DeadLetter]:
        """The dead letters of ``(score, redis id, queue)`` triples, in that order."""
        assert self._redis is not None
        by_queue: dict[str, list[str]] = {}
        for _score, key, queue in chosen:
            by_queue.setdefault(queue, []).append(key)
        datas: dict[tuple[str, str], Any] = {}
        for queue, keys in by_queue.items():
            values = self._redis.client.hmget(self._key(queue) + ".msgs", keys)
            datas.update(((queue, k), v) for k, v in zip(keys, values, strict=True))
        out = []
        for score, key, queue in chosen:
            data = datas.get((queue, key))
            if data is not None:  # removed between the two reads
                at = datetime.fromtimestamp(score / 1000, timezone.utc)
                message = decoded(data)
                out.append(undecodable_letter(data, queue=queue, key=key, at=at)
                           if message is None else dead_letter_of(message, key=key, at=at))
        return out


def _bound(moment: datetime | None, default: str, *, exclusive: bool = False) -> str:
    if moment is None:
        return default
    aware = moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)
    millis = aware.timestamp() * 1000
    return f"({millis!r}" if exclusive else repr(millis)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def open_console_backend(*, app: str | None = None, broker: str | None = None,
                         queues: Sequence[str] = (),
                         options: Mapping[str, str] | None = None) -> DramatiqConsole:
    """The ``ojs_adapters.console`` entry point: the arguments of ``open_dead_letter_queue``."""
    return DramatiqConsole(open_dead_letter_queue(app=app, broker=broker, queues=queues,
                                                  options=options))
