"""``DeadLetterQueue``: the one API over both frameworks' dead letters, and its implementation.

An adapter only implements ``DeadLetterStore`` (read every dead letter of a queue,
remove exact dead messages, move exact dead messages back to their queue, clear a
queue); ``DeadLetters`` adds filtering, paging, selection, retention and batching
on top, identically for Celery and Dramatiq.

**Replay is safe to interrupt.** A store moves each dead message back atomically:
the replayed copy is published and *that* dead message removed in one broker
operation (a Redis script; an AMQP transaction; one step in memory), so a replay
stopped at any point leaves every job either still dead or queued once, never
both and never neither. Replaying the same id twice is a no-op the second time:
the dead message it named is gone. The job record is stamped with the replay
*before* the move (the worker may start the job at once and must not have its
record overwritten): a replay stopped in that window leaves a record saying
``replay_count`` n+1 while the job is still dead, until the replay is run again.

>>> from ojs_adapters.runtime.dlq.memory import MemoryDeadLetterStore
>>> queue = DeadLetters(MemoryDeadLetterStore())
>>> queue.list().total
0
"""

from __future__ import annotations

import builtins
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import NamedTuple, Protocol, TypeAlias

from ojs_adapters.history import utc_now
from ojs_adapters.runtime.dlq._discovery import Coverage
from ojs_adapters.runtime.dlq._model import DeadLetter, DeadLetterFilter, Page, ReplayMark
from ojs_adapters.runtime.dlq._retention import DEFAULT_RETENTION, Retention, expired

#: What ``replay`` and ``delete`` act on: a filter, or job ids.
Selection: TypeAlias = "DeadLetterFilter | Iterable[str]"
#: Dead messages moved back per store call during a replay.
REPLAY_BATCH = 100
#: Default page size of ``list``.
PAGE_SIZE = 50


class ReplayReport(NamedTuple):
    """Ids sent back to their queues; ids asked for but not (or no longer) dead letters."""

    replayed: tuple[str, ...]
    skipped: tuple[str, ...]


class DeleteReport(NamedTuple):
    """Ids of the dead letters removed (one per dead message); ids asked for but not (or no
    longer) dead letters. ``int(report)`` is how many were removed (what ``delete`` returned
    before it reported ids); ``len(report)`` is a tuple's, 2.

    >>> int(DeleteReport(("a", "b"), ("typo",))), bool(DeleteReport((), ("typo",)))
    (2, False)
    """

    deleted: tuple[str, ...]
    skipped: tuple[str, ...]

    def __int__(self) -> int:
        return len(self.deleted)

    def __bool__(self) -> bool:
        """Whether anything was removed (as the count ``delete`` returned before was)."""
        return bool(self.deleted)


class DeadLetterStore(Protocol):
    """What an adapter implements over one broker's dead-letter queues."""

    #: ``"celery"`` or ``"dramatiq"``.
    framework: str

    def queues(self) -> list[str]:
        """The original queues that have a dead-letter queue, sorted."""

    def coverage(self) -> Coverage:
        """Where the last look for dead-letter queues looked (looking now if none was made)."""

    def scan(self, queue: str | None = None) -> list[DeadLetter]:
        """Every dead letter of ``queue`` (of every queue for ``None``)."""

    def remove(self, letters: Sequence[DeadLetter]) -> list[str]:
        """Remove exactly these dead messages (by ``key``); the keys of those that were still
        there, one per message removed."""

    def requeue(self, moves: Sequence[tuple[DeadLetter, ReplayMark]]) -> list[str]:
        """Move each dead message back to its queue as a fresh attempt 1 carrying its mark.

        Atomic per dead message (see the module docstring); returns the ids moved.
        """

    def clear(self, queue: str) -> int:
        """Remove every dead letter of ``queue``; how many there were."""

    def close(self) -> None:
        """Release connections."""


class DeadLetterQueue(Protocol):
    """Dead-letter management for one framework on one broker (see ``DeadLetters``)."""

    def queues(self) -> builtins.list[str]: ...

    def coverage(self) -> Coverage: ...

    def list(self, filters: DeadLetterFilter | None = None, *, page: int = 1,
             per_page: int = PAGE_SIZE) -> Page: ...

    def show(self, job_id: str) -> DeadLetter | None: ...

    def replay(self, selection: Selection, *, limit: int | None = None) -> ReplayReport: ...

    def delete(self, selection: Selection) -> DeleteReport: ...

    def purge(self, filters: DeadLetterFilter | None = None) -> int: ...

    def prune(self, retention: Retention = DEFAULT_RETENTION, *, queue: str | None = None,
              now: datetime | None = None) -> int: ...

    def close(self) -> None: ...


class DeadLetters:
    """``DeadLetterQueue`` over any ``DeadLetterStore``.

    >>> dlq = open_dead_letter_queue("dramatiq", broker="redis://localhost")  # doctest: +SKIP
    >>> page = dlq.list(DeadLetterFilter(error_type="payment.*"), per_page=20)  # doctest: +SKIP
    >>> dlq.replay([letter.id for letter in page.items])  # doctest: +SKIP
    >>> dlq.prune(Retention(max_age=timedelta(days=30)))  # doctest: +SKIP
    """

    #: Where the store's broker is, for messages (set by an adapter's opener; ``None``: unsaid).
    broker_url: str | None = None

    def __init__(self, store: DeadLetterStore) -> None:
        self.store = store

    @property
    def framework(self) -> str:
        return self.store.framework

    def queues(self) -> builtins.list[str]:
        """The original queues that have dead letters (or a dead-letter queue)."""
        return self.store.queues()

    def coverage(self) -> Coverage:
        """The dead-letter queues the last operation over every queue looked in, and whether
        that was all of them (RabbitMQ cannot always say: see ``ojs_adapters.runtime.dlq``)."""
        return self.store.coverage()

    def list(self, filters: DeadLetterFilter | None = None, *, page: int = 1,
             per_page: int = PAGE_SIZE) -> Page:
        """Page ``page`` (from 1) of the matching dead letters, oldest first."""
        if page < 1 or per_page < 1:
            raise ValueError("page and per_page start at 1")
        found = self._select(filters or DeadLetterFilter())
        start = (page - 1) * per_page
        return Page(tuple(found[start:start + per_page]), page, per_page, len(found))

    def show(self, job_id: str) -> DeadLetter | None:
        """The dead letter of job ``job_id`` with its history and payload (newest if several)."""
        found = self._select(DeadLetterFilter(ids=frozenset({job_id})))
        return found[-1] if found else None

    def replay(self, selection: Selection, *, limit: int | None = None) -> ReplayReport:
        """Send the selected dead jobs back to their queues, oldest first (at most ``limit``).

        Each goes back as attempt 1 with its history kept and ``replay_count`` /
        ``last_replayed_at`` recorded. Safe to interrupt (module docstring).
        """
        filters = _as_filter(selection)
        chosen = self._select(filters)[:limit]
        replayed: builtins.list[str] = []
        for start in range(0, len(chosen), REPLAY_BATCH):
            now = utc_now()
            batch = chosen[start:start + REPLAY_BATCH]
            moved = set(self.store.requeue([(x, ReplayMark.next_for(x, now=now)) for x in batch]))
            replayed += [x.id for x in batch if x.id in moved]
        done = set(replayed)
        missing = sorted((filters.ids or set()) - {x.id for x in chosen}) if limit is None else []
        return ReplayReport(tuple(replayed),
                            (*(x.id for x in chosen if x.id not in done), *missing))

    def delete(self, selection: Selection) -> DeleteReport:
        """Remove the selected dead letters, reporting each by id as ``replay`` does;
        refuses an empty filter (use ``purge``)."""
        filters = _as_filter(selection)
        if filters.is_empty:
            raise ValueError("delete needs ids or a filter; purge() removes everything")
        chosen = self._select(filters)
        left = Counter(self._remove(chosen))  # keys: exact where a job died twice
        deleted: builtins.list[str] = []
        gone: builtins.list[str] = []  # removed meanwhile (replayed, pruned)
        for letter in chosen:
            if left[letter.key]:
                left[letter.key] -= 1
                deleted.append(letter.id)
            else:
                gone.append(letter.id)
        missing = sorted((filters.ids or set()) - {x.id for x in chosen})
        return DeleteReport(tuple(deleted), (*gone, *missing))

    def purge(self, filters: DeadLetterFilter | None = None) -> int:
        """Remove every dead letter matching ``filters`` (all of them for ``None``)."""
        filters = filters or DeadLetterFilter()
        if filters.is_empty or filters == DeadLetterFilter(queue=filters.queue):
            names = [filters.queue] if filters.queue else self.store.queues()
            return sum(self.store.clear(name) for name in names)
        return len(self._remove(self._select(filters)))

    def prune(self, retention: Retention = DEFAULT_RETENTION, *, queue: str | None = None,
              now: datetime | None = None) -> int:
        """Apply ``retention`` (default: 180 days, 10,000 per queue) to ``queue`` or to all.

        Returns how many dead letters were removed.
        """
        victims = expired(self.store.scan(queue), retention, now=now)
        return len(self._remove(victims)) if victims else 0

    def close(self) -> None:
        self.store.close()

    def _remove(self, letters: Sequence[DeadLetter]) -> builtins.list[str]:
        """``store.remove``, refusing the count a store written before it returned keys gives."""
        keys = self.store.remove(letters)
        if isinstance(keys, int):
            raise TypeError(f"{type(self.store).__name__}.remove returned a count; a "
                            "DeadLetterStore's remove returns the keys it removed")
        return list(keys)

    def _select(self, filters: DeadLetterFilter) -> builtins.list[DeadLetter]:
        letters = [x for x in self.store.scan(filters.queue) if filters.matches(x)]
        letters.sort(key=lambda x: (x.dead_lettered_at, x.id))
        return letters


def _as_filter(selection: Selection) -> DeadLetterFilter:
    if isinstance(selection, DeadLetterFilter):
        return selection
    if isinstance(selection, str):
        return DeadLetterFilter(ids=frozenset({selection}))
    return DeadLetterFilter(ids=frozenset(selection))
