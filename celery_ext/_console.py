"""The console's view of a Celery app (``ojs_adapters.runtime.browse``; entry point ``console``).

Dead letters come from ``celery_ext.dlq`` (the ``ojs-retry dlq`` API, which replays and
deletes). On Redis, pages are read on the broker: the ``<queue>.dead_letter`` lists are in
dead-lettering order (kombu pushes on the left), so a page is one ``LRANGE`` per list it
spans, counts are ``LLEN``, and only the page is decoded; a filter reads the lists a
``CHUNK`` at a time and reads its fields from the raw envelopes (``_passes``). Pages list
queue by queue (sorted), oldest first within a queue. On RabbitMQ a queue cannot be read
without taking it: pages come from the ``DeadLetters`` listing, depths from passive
declares. A dead-letter queue several queues share (``_dlq_common.shared``) is read letter
by letter, as the store does: its lists and counts are no one queue's.
"""
from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timezone
from fnmatch import fnmatchcase
from typing import Any

from celery_ext._deadletter import DEAD_LETTER_HEADER
from celery_ext._dlq_common import dead_letter_templates, shared
from celery_ext._dlq_redis import RedisDeadLetters, _Envelope
from celery_ext._headers import HEADER, HeaderState
from celery_ext._parking import prefix_of
from celery_ext._waiting import CeleryRetryView
from celery_ext.dlq import open_dead_letter_queue
from celery_ext.records import get_job_record
from ojs_adapters.history import JobRecord
from ojs_adapters.runtime.browse import LetterDetails
from ojs_adapters.runtime.dlq import DeadLetter, DeadLetterFilter, DeadLetters, Page
from ojs_adapters.runtime.raw_fields import needles, raw_error_type, raw_string
from ojs_adapters.runtime.stats import StatsReader

#: Envelopes read per round trip while filtering.
CHUNK = 500
#: Number of RabbitMQ delay levels (``kombu.transport.native_delayed_delivery``).
LEVELS = 28
#: Headers that repeat the job's arguments (Celery's ``argsrepr``/``kwargsrepr``).
_ARGUMENT_HEADERS = frozenset({"argsrepr", "kwargsrepr"})


class CeleryConsole:
    """``ConsoleBackend`` of a Celery app (see the module docstring)."""

    framework = "celery"

    def __init__(self, dead_letters: DeadLetters) -> None:
        self.dead_letters = dead_letters
        self.app: Any = dead_letters.store.app  # type: ignore[attr-defined]
        store = dead_letters.store
        self._redis = store if isinstance(store, RedisDeadLetters) else None

    def retry_view(self, stats: StatsReader | None) -> CeleryRetryView:
        if self._redis is None:
            levels = [f"{prefix_of(self.app)}_celery_delayed_{n}" for n in range(LEVELS)]
            return CeleryRetryView(self.app, stats=stats, count_levels=lambda: sum(
                _amqp_sizes(self.app, levels).values()))
        return CeleryRetryView(self.app, redis=self._redis.client, prefix=self._redis.prefix,
                               stats=stats)

    def record(self, job_id: str) -> JobRecord | None:
        return get_job_record(job_id, app=self.app)

    def stats_client(self) -> Any | None:
        if self._redis is not None:
            return self._redis.client
        backend = self.app.backend
        return backend.client if type(backend).__name__ == "RedisBackend" else None

    def close(self) -> None:
        self.dead_letters.close()

    # -- dead letters ---------------------------------------------------------------

    def describe(self, letter: DeadLetter) -> LetterDetails:
        payload = letter.payload
        headers = dict(payload.get("headers") or {})
        state = HeaderState.from_headers(headers)
        task = self.app.tasks.get(letter.task_type)
        policy = None
        try:
            policy = task.policy(state.policy).to_dict() if task is not None and \
                hasattr(task, "policy") else state.policy
        except Exception:  # an unreadable header policy: show none rather than guess
            policy = None
        shown = {k: v for k, v in headers.items() if k not in _ARGUMENT_HEADERS and k != HEADER}
        return LetterDetails(shown, policy, state.idempotency_key,
                             {"args": payload.get("args"), "kwargs": payload.get("kwargs")})

    def _any_shared(self, names: Mapping[str, str]) -> bool:
        """Whether a dead-letter queue of ``names`` holds several queues' letters."""
        templates = dead_letter_templates(self.app)
        return any(shared(dead, original, templates) for dead, original in names.items())

    def depths(self) -> dict[str, int]:
        names: dict[str, str] = self.dead_letters.store._names()  # type: ignore[attr-defined]
        if self._any_shared(names):
            return dict(Counter(x.queue for x in self.dead_letters.store.scan()))
        if self._redis is None:
            return _amqp_depths(self.app, names)
        out: dict[str, int] = {}
        for queue, keys in self._lists(names).items():
            with self._redis.client.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.llen(key)
                out[queue] = sum(pipe.execute())
        return out

    def letters(self, filters: DeadLetterFilter, *, page: int = 1, per_page: int = 50) -> Page:
        redis = self._redis
        if redis is None or self._any_shared(names := redis._names()):
            return self.dead_letters.list(filters, page=page, per_page=per_page)
        start = (page - 1) * per_page
        lists = self._lists(names, filters.queue)
        if filters == DeadLetterFilter(queue=filters.queue):  # broker-side slices only
            return Page(tuple(self._slice(lists, start, per_page)), page, per_page,
                        sum(self._lengths(lists).values()))
        total, kept, rest = 0, [], replace(  # the lists are the queue's
            filters, queue=None, since=_aware(filters.since), until=_aware(filters.until))
        for key, raw, queue in self._scan(lists, needles(filters)):
            if not _passes(raw, rest):  # exact: the filter's own test
                continue
            if start <= total < start + per_page:  # only the page is decoded
                kept.append(redis._letter(_Envelope(key, raw, json.loads(raw)), queue))
            total += 1
        return Page(tuple(kept), page, per_page, total)

    def letter(self, job_id: str, queue: str | None = None,
               key: str | None = None) -> DeadLetter | None:
        redis = self._redis
        if redis is None or self._any_shared(names := redis._names()):
            return self.dead_letters.show(job_id)
        found = None
        for list_key, raw, original in self._scan(self._lists(names, queue), [job_id.encode()]):
            letter = redis._letter(_Envelope(list_key, raw, json.loads(raw)), original)
            if letter.id == job_id:
                found = letter  # the newest one wins, as DeadLetters.show
        return found

    def _lists(self, names: Mapping[str, str], queue: str | None = None) -> dict[str, list[str]]:
        """``{original queue: [its dead-letter list keys]}`` of ``names``, sorted by queue."""
        assert self._redis is not None
        out: dict[str, list[str]] = {}
        for dead, original in sorted(names.items(), key=lambda x: x[1]):
            if queue in (None, original):
                out.setdefault(original, []).extend(dict.fromkeys(self._redis._lists(dead)))
        return out

    def _lengths(self, lists: Mapping[str, list[str]]) -> dict[tuple[str, str], int]:
        assert self._redis is not None
        pairs = [(q, k) for q, keys in lists.items() for k in keys]
        with self._redis.client.pipeline(transaction=False) as pipe:
            for _q, key in pairs:
                pipe.llen(key)
            return dict(zip(pairs, pipe.execute(), strict=True))

    def _slice(self, lists: Mapping[str, list[str]], start: int,
               count: int) -> Iterator[DeadLetter]:
        """Letters ``start..start+count`` of the lists end to end, each list oldest first."""
        assert self._redis is not None
        for (queue, key), length in self._lengths(lists).items():
            if count <= 0:
                return
            if start >= length:
                start -= length
                continue
            first, last = -(start + count), -(start + 1)  # oldest is at the right end
            raws = self._redis.client.lrange(key, max(first, -length), last)
            for raw in reversed(raws):
                yield self._redis._letter(_Envelope(key, raw, json.loads(raw)), queue)
            count -= len(raws)
            start = 0

    def _scan(self, lists: Mapping[str, list[str]],
              needles: Sequence[bytes]) -> Iterator[tuple[str, bytes, str]]:
        """``(list key, raw envelope, queue)`` of the envelopes holding every needle, list
        by list, oldest first, a chunk at a time (none decoded)."""
        assert self._redis is not None
        for queue, keys in lists.items():
            for key in keys:
                end = -1
                while True:
                    raws = self._redis.client.lrange(key, end - CHUNK + 1, end)
                    for raw in reversed(raws):
                        if all(n in raw for n in needles):
                            yield key, raw, queue
                    if len(raws) < CHUNK:
                        break
                    end -= CHUNK


def _passes(raw: bytes, filters: DeadLetterFilter) -> bool:
    """The filter on task, error type, time and ids (dates timezone-aware), read from the
    raw envelope's bytes where they say a field plainly (``raw_string``: no decoding; the
    error type from ``x-ojs-error-details``, the time from ``ojs-dead-letter``), else
    from the decoded headers. A field read that fails settles it, whatever the rest."""
    if filters.ids is not None:
        if (job_id := raw_string(raw, b"id")) is None:
            return _may_match(json.loads(raw), filters)
        if job_id not in filters.ids:
            return False
    if filters.task_type is not None:
        if (task := raw_string(raw, b"task")) is None:
            return _may_match(json.loads(raw), filters)
        if not fnmatchcase(task, filters.task_type):
            return False
    if filters.error_type is not None:
        if (error := raw_error_type(raw)) is None:
            return _may_match(json.loads(raw), filters)
        if not fnmatchcase(error, filters.error_type):
            return False
    if filters.since is None and filters.until is None:
        return True
    if (stamp := raw_string(raw, b"updated_at", escaped=True)) is None:
        return _may_match(json.loads(raw), filters)
    at = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    at = at if at.tzinfo else at.replace(tzinfo=timezone.utc)
    return (filters.since is None or at >= filters.since) and (
        filters.until is None or at < filters.until)


def _may_match(data: Mapping[str, Any], filters: DeadLetterFilter) -> bool:
    """The filter on task, error type, time and ids, from the headers alone (no body
    decoding; the ``ojs-dead-letter`` record only when the error type or time is asked)."""
    headers = data.get("headers") or {}
    if filters.ids is not None and str(headers.get("id")) not in filters.ids:
        return False
    if filters.task_type is not None and not fnmatchcase(str(headers.get("task")),
                                                         filters.task_type):
        return False
    if filters.error_type is None and filters.since is None and filters.until is None:
        return True
    raw = headers.get(DEAD_LETTER_HEADER)
    record = json.loads(raw) if raw else {}
    errors = record.get("errors") or [e.to_dict() for e in
                                      HeaderState.from_headers(headers).errors]
    error_type = errors[-1].get("type") if errors else None
    if filters.error_type is not None and not fnmatchcase(error_type or "", filters.error_type):
        return False
    if filters.since is None and filters.until is None:
        return True
    stamp = record.get("updated_at") or (errors[-1].get("occurred_at") if errors else None)
    moment = datetime.fromisoformat(str(stamp).replace("Z", "+00:00")) if stamp else \
        datetime.now(timezone.utc)
    return DeadLetterFilter(since=filters.since, until=filters.until).matches(DeadLetter(
        id="", queue="", task_type="", error_type=None, dead_lettered_at=moment, attempt=0))


def _aware(moment: datetime | None) -> datetime | None:
    return moment.replace(tzinfo=timezone.utc) if moment and not moment.tzinfo else moment


def _amqp_depths(app: Any, names: Mapping[str, str]) -> dict[str, int]:
    """Messages in each dead-letter queue of ``names`` (``{dead: original}``), by a passive
    declare (nothing is taken)."""
    out: dict[str, int] = {}
    for dead, count in _amqp_sizes(app, list(names)).items():
        out[names[dead]] = out.get(names[dead], 0) + count
    return out


def _amqp_sizes(app: Any, queues: Sequence[str]) -> dict[str, int]:
    """Messages in each of ``queues`` that exists, by passive declares (nothing is taken)."""
    out: dict[str, int] = {}
    with app.pool.acquire(block=True) as conn:  # a pooled connection, one channel
        channel = None  # until a 404 closes it
        for name in queues:
            channel = channel or conn.channel()
            try:
                out[name] = int(channel.queue_declare(queue=name, passive=True).message_count)
            except conn.channel_errors:  # not declared: nothing there
                channel = None
        with contextlib.suppress(Exception):
            if channel is not None:
                channel.close()
    return out


def open_console_backend(*, app: str | None = None, broker: str | None = None,
                         queues: Sequence[str] = (),
                         options: Mapping[str, str] | None = None) -> CeleryConsole:
    """The ``ojs_adapters.console`` entry point: the arguments of ``open_dead_letter_queue``."""
    return CeleryConsole(open_dead_letter_queue(app=app, broker=broker, queues=queues,
                                                options=options))
