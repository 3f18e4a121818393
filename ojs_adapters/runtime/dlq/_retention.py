"""Dead-letter retention: how long and how many dead letters each queue keeps.

Dead letters older than ``max_age`` go, then the oldest beyond ``max_count`` in
each queue (the newest are kept). ``None`` switches a limit off. Pruning runs on
demand (``DeadLetterQueue.prune``, ``ojs-retry dlq prune``) or from a scheduler
through ``prune_hook`` (``_prune_hook``).

>>> from datetime import datetime, timezone
>>> def at(day): return datetime(2026, 1, day, tzinfo=timezone.utc)
>>> letters = [DeadLetter(id=str(d), queue="q", task_type="t", error_type=None,
...                       dead_lettered_at=at(d), attempt=1) for d in (1, 2, 3, 4)]
>>> rule = Retention(max_age=timedelta(days=2), max_count=1)
>>> [x.id for x in expired(letters, rule, now=at(4))]
['1', '2', '3']
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from ojs_adapters.history import utc_now
from ojs_adapters.runtime.dlq._model import DeadLetter

#: Default longest time a dead letter is kept.
DEFAULT_MAX_AGE = timedelta(days=180)
#: Default most dead letters kept per queue.
DEFAULT_MAX_COUNT = 10_000


@dataclass(frozen=True, slots=True)
class Retention:
    """A retention rule: ``max_age`` (a ``timedelta``) and ``max_count`` per queue.

    >>> Retention().max_age.days, Retention().max_count
    (180, 10000)
    """

    max_age: timedelta | None = DEFAULT_MAX_AGE
    max_count: int | None = DEFAULT_MAX_COUNT

    def __post_init__(self) -> None:
        if self.max_age is not None and self.max_age < timedelta(0):
            raise ValueError("max_age must not be negative")
        if self.max_count is not None and self.max_count < 0:
            raise ValueError("max_count must not be negative")


#: The retention applied when none is given.
DEFAULT_RETENTION = Retention()


def expired(letters: Iterable[DeadLetter], retention: Retention, *,
            now: datetime | None = None) -> list[DeadLetter]:
    """The dead letters ``retention`` says to remove, oldest first."""
    now = now or utc_now()
    drop: list[DeadLetter] = []
    by_queue: dict[str, list[DeadLetter]] = defaultdict(list)
    for letter in letters:
        age = now - letter.dead_lettered_at
        too_old = retention.max_age is not None and age > retention.max_age
        (drop if too_old else by_queue[letter.queue]).append(letter)
    if retention.max_count is not None:
        for kept in by_queue.values():
            kept.sort(key=_age_order)
            drop.extend(kept[:max(0, len(kept) - retention.max_count)])
    return sorted(drop, key=_age_order)


def _age_order(letter: DeadLetter) -> tuple[datetime, str]:
    return (letter.dead_lettered_at, letter.id)
