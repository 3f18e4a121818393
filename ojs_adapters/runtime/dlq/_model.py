"""The values of dead-letter management: one dead job, a filter, a page, a replay mark.

All frozen, all framework-free: the Celery and Dramatiq adapters build ``DeadLetter``
values from their brokers' dead-letter queues, and everything else (filtering,
paging, retention, the CLI) works on these values only. A replay mark travels in a
replayed message (``REPLAY_HEADER``, read back by ``replay_info``).

>>> letter = DeadLetter(id="m1", queue="emails", task_type="send", error_type="smtp.Down",
...                     dead_lettered_at=datetime(2026, 1, 2, tzinfo=timezone.utc), attempt=3)
>>> DeadLetterFilter(queue="emails", error_type="smtp.*").matches(letter)
True
>>> letter.to_dict()["dead_lettered_at"]
'2026-01-02T00:00:00.000Z'
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from fnmatch import fnmatchcase
from typing import Any, NamedTuple

from ojs_adapters.history import ErrorEntry, JobRecord, iso_utc
from ojs_adapters.runtime.handoff import HANDED_OFF

#: Message header carrying a replayed job's ``ReplayMark.to_dict()`` as JSON, on brokers
#: whose messages have headers (Celery's; Dramatiq's mark rides in ``options["ojs"]``).
REPLAY_HEADER = "ojs-replay"


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One dead-lettered job, as read from a framework's dead-letter queue.

    ``id`` is the job (task or message) id; ``queue`` the queue it was sent to and
    goes back to on replay; ``attempt`` the last attempt it ran; ``history`` its
    error entries, oldest first; ``payload`` the original message as the framework
    stored it (arguments, options, headers). ``key`` is the broker's handle on this
    exact dead message (a Redis id, a body digest) so that ``replay`` and ``delete``
    act on the message that was listed and on no other.
    """

    id: str
    queue: str
    task_type: str
    error_type: str | None
    dead_lettered_at: datetime
    attempt: int
    history: tuple[ErrorEntry, ...] = ()
    payload: Mapping[str, Any] = field(default_factory=dict)
    error_code: str | None = None
    replay_count: int = 0
    last_replayed_at: str | None = None
    key: str = ""

    def to_dict(self, *, payload: bool = True) -> dict[str, Any]:
        """Plain JSON; ``payload=False`` leaves the payload out (for listings and logs)."""
        out: dict[str, Any] = {
            "id": self.id,
            "queue": self.queue,
            "task_type": self.task_type,
            "error_type": self.error_type,
            "error_code": self.error_code,
            "dead_lettered_at": iso_utc(self.dead_lettered_at),
            "attempt": self.attempt,
            "replay_count": self.replay_count,
            "last_replayed_at": self.last_replayed_at,
            "history": [e.to_dict() for e in self.history],
        }
        if payload:
            out["payload"] = dict(self.payload)
        return out


def last_error(history: tuple[ErrorEntry, ...]) -> tuple[str | None, str | None]:
    """``(type, code)`` of the newest entry of ``history`` (``None``s when empty)."""
    return (history[-1].type, history[-1].code) if history else (None, None)


@dataclass(frozen=True, slots=True)
class DeadLetterFilter:
    """Which dead letters an operation applies to; every field given must match.

    ``task_type`` and ``error_type`` are exact names or shell patterns
    (``payment.*``, as in ``non_retryable_errors``); ``since``/``until`` bound the
    dead-lettering time (inclusive, exclusive); ``ids`` picks jobs by id.

    >>> DeadLetterFilter(task_type="billing.*").is_empty
    False
    """

    queue: str | None = None
    task_type: str | None = None
    error_type: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    ids: frozenset[str] | None = None

    @property
    def is_empty(self) -> bool:
        """Whether this filter matches every dead letter."""
        return self == DeadLetterFilter()

    def matches(self, letter: DeadLetter) -> bool:
        """Whether ``letter`` passes every condition given."""
        if self.queue is not None and letter.queue != self.queue:
            return False
        if self.ids is not None and letter.id not in self.ids:
            return False
        if self.task_type is not None and not fnmatchcase(letter.task_type, self.task_type):
            return False
        if self.error_type is not None and not fnmatchcase(letter.error_type or "",
                                                           self.error_type):
            return False
        if self.since is not None and letter.dead_lettered_at < _aware(self.since):
            return False
        return self.until is None or letter.dead_lettered_at < _aware(self.until)


def _aware(moment: datetime) -> datetime:
    """``moment`` with UTC assumed when it has no timezone."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


class Page(NamedTuple):
    """One page of a listing, oldest dead letter first; ``number`` counts from 1."""

    items: tuple[DeadLetter, ...]
    number: int
    size: int
    total: int

    @property
    def pages(self) -> int:
        """How many pages the listing has (at least 1)."""
        return max(1, -(-self.total // self.size))

    @property
    def has_next(self) -> bool:
        return self.number < self.pages


@dataclass(frozen=True, slots=True)
class ReplayMark:
    """What a replay stamps on the job: its new replay count and when it happened.

    Written into the replayed message's state and into the job record, next to
    the kept history; the attempt count starts again at 1.
    """

    replay_count: int
    replayed_at: str

    @classmethod
    def next_for(cls, letter: DeadLetter, *, now: datetime) -> ReplayMark:
        """The mark for replaying ``letter`` at ``now``."""
        return cls(letter.replay_count + 1, iso_utc(now))

    def to_dict(self) -> dict[str, Any]:
        return {"replay_count": self.replay_count, "last_replayed_at": self.replayed_at}


def replay_info(headers: Mapping[str, Any] | None) -> dict[str, Any]:
    """``{"replay_count", "last_replayed_at"}`` from a message's ``ojs-replay`` header, or ``{}``.

    >>> replay_info({"ojs-replay": '{"replay_count": 2, "last_replayed_at": "x"}'})["replay_count"]
    2
    """
    raw = (headers or {}).get(REPLAY_HEADER)
    try:
        data = json.loads(raw) if isinstance(raw, (str, bytes)) else dict(raw or {})
    except (ValueError, TypeError):
        return {}
    return data if isinstance(data, dict) else {}


#: Record keys of a dead round that a replay drops: the dead letter's hand-off mark, the
#: end reason, where the dead letter went.
ROUND_MARKS = frozenset({HANDED_OFF, "end_reason", "dead_letter_queue"})
#: Record keys of a round's retry delays, which a replay empties: a new round numbers its
#: retries from 1 again.
ROUND_DELAYS = ("countdowns", "delays_ms", "jitter_samples")


def closed_round(errors: tuple[ErrorEntry, ...], replay_round: int) -> tuple[ErrorEntry, ...]:
    """``errors`` with the entries of the round a replay closes stamped ``replay_round``
    (those not stamped yet; earlier rounds' keep theirs), so that the history shows where
    each round starts though every round counts its attempts from 1.

    >>> e = ErrorEntry(1, "HANDLER_ERROR", "E", "m", "2026-01-01T00:00:00.000Z")
    >>> [x.replay_round for x in closed_round((e._replace(replay_round=0), e), 1)]
    [0, 1]
    """
    return tuple(e if e.replay_round is not None else e._replace(replay_round=replay_round)
                 for e in errors)


def entry_rounds(history: Sequence[ErrorEntry], current: int) -> list[int]:
    """The round each entry of ``history`` ran in: its ``replay_round``, else ``current``
    (the job's ``replay_count``: the round still running, or the one that died last).

    >>> e = ErrorEntry(1, "HANDLER_ERROR", "E", "m", "2026-01-01T00:00:00.000Z")
    >>> entry_rounds((e._replace(replay_round=0), e), 1)
    [0, 1]
    """
    return [current if e.replay_round is None else e.replay_round for e in history]


def round_starts(history: Sequence[ErrorEntry], current: int) -> list[int | None]:
    """Per entry of ``history``: the round a dead-letter replay starts there (its attempts
    counted from 1 again), else ``None``; the first entry shown starts none."""
    rounds = entry_rounds(history, current)
    return [None if i == 0 or rounds[i] == rounds[i - 1] else rounds[i]
            for i in range(len(rounds))]


def replayed_record(record: JobRecord, mark: ReplayMark) -> JobRecord:
    """The job record of a job sent again by a replay: a new round, waiting, no attempt yet.

    The history is kept, its dead round's entries stamped (``closed_round``); what the
    dead round left besides (``ROUND_MARKS``, ``ROUND_DELAYS``) goes, so the record reads
    as the new round's from the replay on, on both frameworks.

    >>> rec = JobRecord(id="m1", type="send", queue="q", max_attempts=3, state="discarded",
    ...                 attempt=3, dead_lettered=True, outcome="dead_letter",
    ...                 extra={"end_reason": "exhausted", "countdowns": [1.0, 2.0]})
    >>> new = replayed_record(rec, ReplayMark(1, "2026-01-02T00:00:00.000Z"))
    >>> (new.state, new.attempt, new.dead_lettered, new.outcome, new.extra["replay_count"])
    ('retryable', 0, False, None, 1)
    >>> "end_reason" in new.extra, new.extra["countdowns"]
    (False, [])
    """
    extra = {k: v for k, v in record.extra.items() if k not in ROUND_MARKS}
    extra.update({k: [] for k in ROUND_DELAYS if k in extra})
    return replace(record, state="retryable", attempt=0, next_retry_at=mark.replayed_at,
                   errors=closed_round(record.errors, mark.replay_count - 1),
                   dead_lettered=False, outcome=None, updated_at=mark.replayed_at,
                   extra={**extra, **mark.to_dict()})
