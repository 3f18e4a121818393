"""Decision statistics for the console: counted in process, flushed to Redis in the background.

``enable_stats(url)`` installs a decision hook (``ojs_adapters.runtime.events``) that only
adds to a dict in memory: no Redis call on a worker's job path. A daemon thread
flushes what was counted every ``interval`` seconds (2) in one pipeline:

- ``<prefix>:m:<minute>``: a hash per minute (TTL 26 h), field
  ``framework␟task␟queue␟decision␟error type``, value the count;
- ``<prefix>:h:<hour>``: the same per hour (TTL 8 days);
- ``<prefix>:<framework>:waiting``: the retries decided and not yet due, scored by
  due time, with their task, queue, attempt and error in ``...:waiting:info``. The
  console lists these where the broker cannot list waiting retries (RabbitMQ).

Call it once in every worker process's import path (the module your workers load),
for Celery and Dramatiq alike; a forked child starts counting afresh. The console
(``ojs_adapters.web``) reads the hashes with ``StatsReader``.

>>> recorder = DecisionStats(client=None)
>>> recorder.pending()
0
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from ojs_adapters.runtime import events
from ojs_adapters.runtime._periodic import Periodic

logger = logging.getLogger("ojs_adapters.stats")

#: Default key prefix of the statistics in Redis.
DEFAULT_PREFIX = "ojs-stats"
#: Seconds between two flushes.
FLUSH_SECONDS = 2.0
#: TTL of a minute hash, seconds (a day and two hours: the day view is always whole).
MINUTE_TTL = 26 * 3600
#: TTL of an hour hash, seconds.
HOUR_TTL = 8 * 86400
#: Seconds a retry stays in the waiting index after it fell due.
WAITING_GRACE = 5.0
#: Field separator (the ASCII unit separator: never in a task, queue or error type).
SEP = "\x1f"
#: Decisions as the console names them.
DECISIONS = ("retry", "dead_letter", "discard", "fail")
#: Entries of the waiting index read per round trip when filtering.
_CHUNK = 1000

#: Drops waiting entries due before ARGV[1] (at most 1,000 per call) and their info.
_TRIM = """
local old = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, 1000)
if #old > 0 then
  redis.call('ZREM', KEYS[1], unpack(old))
  redis.call('HDEL', KEYS[2], unpack(old))
end
return #old
"""


def waiting_keys(prefix: str, framework: str) -> tuple[str, str]:
    """The waiting index of ``framework``: the sorted set and its info hash."""
    return f"{prefix}:{framework}:waiting", f"{prefix}:{framework}:waiting:info"


def _clean(text: str) -> str:
    return text.replace(SEP, " ")[:200]


class DecisionStats:
    """The decision hook that counts; ``flush()`` writes the counts (see the module docstring).

    ``client`` is a ``redis.Redis``; ``None`` counts without writing (tests, the doctest).
    """

    def __init__(self, client: Any, *, prefix: str = DEFAULT_PREFIX,
                 interval: float = FLUSH_SECONDS) -> None:
        self.client = client
        self.prefix = prefix
        self.interval = interval
        self._lock = threading.Lock()
        self._counts: Counter[tuple[int, str]] = Counter()
        self._waiting: dict[tuple[str, str], tuple[float, str] | None] = {}
        self._pid = os.getpid()
        self._runner: Periodic | None = None
        self._trim: Any = None

    def __call__(self, event: events.DecisionEvent) -> None:
        d = event.decision
        now = time.time()
        field = SEP.join(_clean(x) for x in (event.framework, event.task, event.queue,
                                                d.action, d.entry.type or "-"))
        if d.action == "retry":
            info = json.dumps({"task": event.task, "queue": event.queue,
                               "attempt": d.attempt + 1, "max_attempts": event.max_attempts,
                               "error_type": d.entry.type, "error_code": d.entry.code})
            waiting: tuple[float, str] | None = (now + float(d.delay or 0.0), info)
        else:
            waiting = None
        self._own_process()
        with self._lock:
            self._counts[(int(now // 60), field)] += 1
            self._waiting[(event.framework, event.job_id)] = waiting
        if self._runner is not None and not self._runner.running:
            self._runner.start()

    def pending(self) -> int:
        """Counts not flushed yet."""
        with self._lock:
            return sum(self._counts.values())

    def flush(self) -> None:
        """Write what was counted: one pipeline (and the trim script now and then)."""
        with self._lock:
            counts, self._counts = self._counts, Counter()
            waiting, self._waiting = self._waiting, {}
        if self.client is None or not (counts or waiting):
            return
        try:
            self._write(counts, waiting)
        except Exception:
            with self._lock:  # keep them for the next flush
                self._counts.update(counts)
                for key, value in waiting.items():
                    self._waiting.setdefault(key, value)
            raise

    def _write(self, counts: Counter[tuple[int, str]],
               waiting: dict[tuple[str, str], tuple[float, str] | None]) -> None:
        with self.client.pipeline(transaction=False) as pipe:
            for (minute, field), n in counts.items():
                pipe.hincrby(f"{self.prefix}:m:{minute}", field, n)
                pipe.expire(f"{self.prefix}:m:{minute}", MINUTE_TTL)
                pipe.hincrby(f"{self.prefix}:h:{minute // 60}", field, n)
                pipe.expire(f"{self.prefix}:h:{minute // 60}", HOUR_TTL)
            for (framework, job_id), entry in waiting.items():
                index, info = waiting_keys(self.prefix, framework)
                if entry is None:
                    pipe.zrem(index, job_id)
                    pipe.hdel(info, job_id)
                else:
                    pipe.zadd(index, {job_id: entry[0]})
                    pipe.hset(info, job_id, entry[1])
            pipe.execute()
        if self._trim is None:
            self._trim = self.client.register_script(_TRIM)
        for framework in {f for f, _ in waiting}:
            self._trim(keys=list(waiting_keys(self.prefix, framework)),
                       args=[time.time() - 3600])

    def start(self) -> None:
        """Flush every ``interval`` seconds from a daemon thread (started on first use)."""
        self._runner = Periodic("ojs-stats-flusher", self.flush, self.interval, logger=logger)
        self._runner.start()

    def stop(self) -> None:
        """Stop the thread and flush what is left."""
        if self._runner is not None:
            self._runner.stop()
        self.flush()

    def _own_process(self) -> None:
        """After a fork (Celery's prefork pool), start from zero with a thread of our own."""
        if os.getpid() == self._pid:
            return
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._counts, self._waiting = Counter(), {}
        if self._runner is not None:
            self._runner = Periodic("ojs-stats-flusher", self.flush, self.interval,
                                    logger=logger)


#: The recorders ``enable_stats`` installed (a registry: ``disable_stats`` removes them).
STATS_REGISTRY: list[DecisionStats] = []


def enable_stats(url: str | None = None, *, client: Any = None, prefix: str = DEFAULT_PREFIX,
                 interval: float = FLUSH_SECONDS) -> DecisionStats:
    """Count every decision of this process and flush the counts to Redis (``url`` or ``client``).

    >>> # in the module your workers import:  enable_stats("redis://127.0.0.1:6379/0")
    """
    if client is None:
        import redis

        if url is None:
            raise ValueError("enable_stats needs a Redis url or client")
        client = redis.Redis.from_url(url)
    recorder = DecisionStats(client, prefix=prefix, interval=interval)
    recorder.start()
    STATS_REGISTRY.append(recorder)
    events.add_hook(recorder)
    return recorder


def disable_stats() -> None:
    """Remove every recorder ``enable_stats`` installed, flushing each."""
    while STATS_REGISTRY:
        recorder = STATS_REGISTRY.pop()
        events.remove_hook(recorder)
        recorder.stop()


@dataclass(frozen=True, slots=True)
class Count:
    """One counted cell: decisions of one kind for one task, queue and error type."""

    framework: str
    task: str
    queue: str
    decision: str
    error_type: str
    n: int


class StatsReader:
    """Reads the hashes ``DecisionStats`` writes."""

    def __init__(self, client: Any, *, prefix: str = DEFAULT_PREFIX) -> None:
        self.client, self.prefix = client, prefix

    def minutes(self, first: int, last: int, framework: str) -> dict[int, list[Count]]:
        """Counts per minute number (POSIX minutes) in ``first..last``: one round trip."""
        return self._read("m", range(first, last + 1), framework)

    def hours(self, first: int, last: int, framework: str) -> dict[int, list[Count]]:
        """Counts per hour number in ``first..last``: one round trip."""
        return self._read("h", range(first, last + 1), framework)

    def _read(self, kind: str, buckets: Iterable[int], framework: str) -> dict[int, list[Count]]:
        numbers = list(buckets)
        with self.client.pipeline(transaction=False) as pipe:
            for n in numbers:
                pipe.hgetall(f"{self.prefix}:{kind}:{n}")
            found = pipe.execute()
        out: dict[int, list[Count]] = {}
        for n, data in zip(numbers, found, strict=True):
            cells = [(_text(raw).split(SEP), int(value)) for raw, value in data.items()]
            out[n] = [Count(p[0], p[1], p[2], p[3], p[4], value) for p, value in cells
                      if len(p) == 5 and p[0] == framework]  # framework␟task␟queue␟...
        return out

    def waiting(self, framework: str, *, offset: int, count: int, queue: str | None = None,
                task: str | None = None, now: float | None = None,
                ) -> tuple[int, list[tuple[str, float, dict[str, Any]]]]:
        """``(total, [(job id, due, info)])`` of the waiting index, soonest first.

        Without a filter, one round trip; with ``queue``/``task`` (exact, or a shell
        pattern for the task) the index is read in chunks of 1,000, never whole.
        """
        index, info = waiting_keys(self.prefix, framework)
        low = (time.time() if now is None else now) - WAITING_GRACE
        if queue is None and task is None:
            with self.client.pipeline(transaction=False) as pipe:
                pipe.zcount(index, low, "+inf")
                pipe.zrangebyscore(index, low, "+inf", start=offset, num=count, withscores=True)
                total, pairs = pipe.execute()
            return int(total), self._rows(info, pairs)
        total, rows, start = 0, [], 0
        while True:
            pairs = self.client.zrangebyscore(index, low, "+inf", start=start, num=_CHUNK,
                                              withscores=True)
            for row in self._rows(info, pairs):
                data = row[2]
                if (queue is None or data.get("queue") == queue) and (
                        task is None or fnmatchcase(str(data.get("task", "")), task)):
                    if offset <= total < offset + count:
                        rows.append(row)
                    total += 1
            if len(pairs) < _CHUNK:
                return total, rows
            start += _CHUNK

    def forget(self, framework: str, ids: Sequence[str]) -> None:
        """Drop jobs ``ids`` from the waiting index (an operator ran or discarded them)."""
        if ids:
            index, info = waiting_keys(self.prefix, framework)
            with self.client.pipeline(transaction=False) as pipe:
                pipe.zrem(index, *ids)
                pipe.hdel(info, *ids)
                pipe.execute()

    def _rows(self, info: str, pairs: list[Any]) -> list[tuple[str, float, dict[str, Any]]]:
        ids = [_text(k) for k, _ in pairs]
        datas = self.client.hmget(info, ids) if ids else []
        return [(job_id, float(score), json.loads(data) if data else {})
                for job_id, (_, score), data in zip(ids, pairs, datas, strict=True)]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
