"""What the operator console reads from a framework: waiting retries, dead-letter pages, records.

The console (``ojs_adapters.web``) imports no framework. Each adapter declares an
entry point in the group ``ojs_adapters.console`` whose object opens a
``ConsoleBackend`` for an app or broker::

    [project.entry-points."ojs_adapters.console"]
    celery = "celery_ext._console:open_console_backend"

A backend gives the dead letters through the ``ojs_adapters.runtime.dlq`` API (replay,
delete, purge: one code path with ``ojs-retry dlq``), pages of them read on the
broker side where the broker allows it, the dead-letter depth per queue, job
records, and a ``RetryView``: the retries that wait, from every place a setup
keeps them. A place that cannot be listed or acted on says so
(``WaitingSource.note``) instead of showing nothing.

>>> source = WaitingSource("parked", "Parked", listable=True, actionable=True, count=3)
>>> source.count, source.actionable
(3, True)
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from fnmatch import fnmatchcase
from importlib.metadata import entry_points
from typing import Any, NamedTuple, Protocol

from ojs_adapters.history import JobRecord
from ojs_adapters.runtime.dlq import DeadLetter, DeadLetterFilter, DeadLetterQueue, Page
from ojs_adapters.runtime.stats import StatsReader

#: The entry-point group adapters register their ``ConsoleOpener`` under.
ENTRY_POINT_GROUP = "ojs_adapters.console"
#: The source of waiting retries read from the workers' decisions (``ojs_adapters.runtime.stats``).
DECIDED = "decided"
#: Seconds an entry of a parked-retry index stays after it fell due (trimmed on write).
INDEX_KEEP = 3600.0
#: Seconds after its due time an index entry is still listed (its message may be arriving).
INDEX_GRACE = 5.0


@dataclass(frozen=True, slots=True)
class WaitingRetry:
    """One retry waiting for its countdown: never the job's arguments.

    ``attempt`` is the attempt it will run as; ``due_at`` when it may start;
    ``source`` the ``WaitingSource`` it was read from; ``key`` the broker's handle
    on it for ``retry_now``/``discard`` (``""`` where it cannot be acted on).
    """

    id: str
    task: str
    queue: str
    attempt: int
    max_attempts: int | None
    error_type: str | None
    error_code: str | None
    due_at: datetime | None
    source: str
    key: str = ""


@dataclass(frozen=True, slots=True)
class WaitingSource:
    """One place a setup keeps waiting retries, and what the console can do there.

    ``count`` is ``None`` where the broker cannot say; ``note`` tells the operator,
    plainly, what is not listable or not actionable and why.
    """

    name: str
    title: str
    listable: bool
    actionable: bool
    count: int | None
    note: str = ""


class WaitingFilter(NamedTuple):
    """Which waiting retries to list: exact queue, task name or shell pattern."""

    queue: str | None = None
    task: str | None = None

    def matches(self, retry: WaitingRetry) -> bool:
        """Whether ``retry`` passes.

        >>> WaitingFilter(task="billing.*").matches(WaitingRetry(
        ...     "j", "billing.charge", "q", 2, 3, None, None, None, "parked"))
        True
        """
        if self.queue is not None and retry.queue != self.queue:
            return False
        return self.task is None or fnmatchcase(retry.task, self.task)


class WaitingPage(NamedTuple):
    """One page of a source's waiting retries, soonest first; ``number`` counts from 1."""

    items: tuple[WaitingRetry, ...]
    number: int
    size: int
    total: int

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.size))


@dataclass(frozen=True, slots=True)
class LetterDetails:
    """What a dead letter's page shows beside its history.

    ``headers``: the message's headers (Celery) or options (Dramatiq), without the
    history (shown apart) and without argument representations; ``arguments``: the
    job's ``args``/``kwargs``, shown only when the operator turned that on.
    """

    headers: Mapping[str, Any]
    policy: Mapping[str, Any] | None
    idempotency_key: str | None
    arguments: Mapping[str, Any]


class RetryView(Protocol):
    """The waiting retries of one framework on one broker."""

    def sources(self) -> list[WaitingSource]:
        """Every place this setup keeps waiting retries, listable or not, with counts."""

    def page(self, source: str, filters: WaitingFilter, *, page: int = 1,
             per_page: int = 50) -> WaitingPage:
        """Page ``page`` of a listable source's retries, soonest first."""

    def retry_now(self, source: str, ids: Sequence[str]) -> int:
        """Make these waiting retries due now (an actionable source); how many moved."""

    def discard(self, source: str, ids: Sequence[str]) -> int:
        """Drop these waiting retries and mark their records discarded; how many."""


class ConsoleBackend(Protocol):
    """What the console needs of one framework on one broker."""

    framework: str

    @property
    def dead_letters(self) -> DeadLetterQueue:
        """The dead letters, through the one API ``ojs-retry dlq`` uses (replay, delete...);
        read-only, so an implementation may keep its own kind of queue in an attribute."""

    def retry_view(self, stats: StatsReader | None) -> RetryView:
        """The waiting retries; ``stats`` (when the workers record statistics) lists the
        retries the broker cannot list, from the decisions the workers reported."""

    def letters(self, filters: DeadLetterFilter, *, page: int = 1,
                per_page: int = 50) -> Page:
        """A page of dead letters (payloads included), read on the broker side if it can."""

    def letter(self, job_id: str, queue: str | None = None,
               key: str | None = None) -> DeadLetter | None:
        """The dead letter of ``job_id`` (the newest, if it died more than once), or ``None``;
        ``key`` (the ``DeadLetter.key`` a listing gave) makes it one read where it can."""

    def depths(self) -> dict[str, int]:
        """Dead letters per original queue, counted by the broker."""

    def describe(self, letter: DeadLetter) -> LetterDetails:
        """Headers, effective policy, idempotency key and arguments of ``letter``."""

    def record(self, job_id: str) -> JobRecord | None:
        """The job record of ``job_id``, where the workers keep records."""

    def stats_client(self) -> Any | None:
        """A client of the Redis the statistics are read from by default: the broker's, the
        job records' (Dramatiq's ``RedisRecordStore``) or the result backend's Redis
        (``None``: none is Redis)."""

    def close(self) -> None:
        """Release connections."""


class ConsoleOpener(Protocol):
    """Opens a framework's ``ConsoleBackend`` (the arguments of ``runtime.dlq.Opener``)."""

    def __call__(self, *, app: str | None = None, broker: str | None = None,
                 queues: Sequence[str] = (),
                 options: Mapping[str, str] | None = None) -> ConsoleBackend: ...


def open_console_backend(framework: str, *, app: str | None = None, broker: str | None = None,
                         queues: Sequence[str] = (),
                         options: Mapping[str, str] | None = None) -> ConsoleBackend:
    """The ``ConsoleBackend`` of ``framework``; ``LookupError`` when no adapter offers one."""
    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == framework]
    if not found:
        names = sorted({ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})
        raise LookupError(f"no console backend for {framework!r}; installed: "
                          f"{', '.join(names) or 'none'}")
    opener: ConsoleOpener = found[0].load()
    return opener(app=app, broker=broker, queues=queues, options=options or {})


def decided_source(stats: StatsReader | None, framework: str, where: str) -> WaitingSource:
    """The waiting retries the workers reported (``ojs_adapters.runtime.stats``), for a setup whose
    broker cannot list them; ``where`` says where they really wait."""
    if stats is None:
        return WaitingSource(DECIDED, "Reported by the workers", listable=False,
                             actionable=False, count=None, note=(
                                 f"{where} Turn on statistics in the workers "
                                 "(ojs_adapters.runtime.stats.enable_stats) to list them here."))
    total, _rows = stats.waiting(framework, offset=0, count=0)
    return WaitingSource(DECIDED, "Reported by the workers", listable=True, actionable=False,
                         count=total, note=(
                             f"{where} Listed from the retry decisions the workers reported "
                             "(statistics); they cannot be moved or dropped from here."))


def decided_page(stats: StatsReader, framework: str, filters: WaitingFilter, *, page: int,
                 per_page: int) -> WaitingPage:
    """A page of the retries the workers reported, soonest first."""
    task = filters.task
    total, rows = stats.waiting(framework, offset=(page - 1) * per_page, count=per_page,
                                queue=filters.queue, task=task)
    items = tuple(
        WaitingRetry(id=job_id, task=str(info.get("task", "?")), queue=str(info.get("queue", "?")),
                     attempt=int(info.get("attempt") or 0),
                     max_attempts=info.get("max_attempts"), error_type=info.get("error_type"),
                     error_code=info.get("error_code"),
                     due_at=datetime.fromtimestamp(due, timezone.utc), source=DECIDED)
        for job_id, due, info in rows)
    return WaitingPage(items, page, per_page, total)


def add_to_index(client: Any, key: str | bytes, member: str, due: float) -> None:
    """Note a retry parked where the broker cannot list it (RabbitMQ's delay levels) in the
    sorted set ``key`` of a Redis ``client``, scored by its due time: one round trip, which
    also trims the entries due more than ``INDEX_KEEP`` s ago."""
    with client.pipeline(transaction=False) as pipe:
        pipe.zadd(key, {member: due})
        pipe.zremrangebyscore(key, "-inf", time.time() - INDEX_KEEP)
        pipe.execute()
