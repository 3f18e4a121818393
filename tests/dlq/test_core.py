"""The framework-free dead-letter API: filters, pages, replay, delete, purge, retention."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from ojs_adapters import ErrorEntry, JobRecord
from ojs_adapters.runtime.dlq import (
    DEFAULT_RETENTION,
    DeadLetter,
    DeadLetterFilter,
    DeadLetters,
    ReplayMark,
    Retention,
    expired,
    frameworks,
    open_dead_letter_queue,
    prune_hook,
    replayed_record,
)
from ojs_adapters.runtime.dlq.memory import MemoryDeadLetterStore

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def letter(n: int, *, queue: str = "q", task: str = "charge", error: str = "net.Timeout",
           at: datetime | None = None, replays: int = 0) -> DeadLetter:
    entry = ErrorEntry(attempt=3, code="HANDLER_ERROR", type=error, message=f"job {n}",
                       occurred_at="2026-01-01T00:00:00.000Z")
    return DeadLetter(id=f"job-{n}", queue=queue, task_type=task, error_type=error,
                      error_code="HANDLER_ERROR", dead_lettered_at=at or T0 + timedelta(hours=n),
                      attempt=3, history=(entry,), payload={"args": [n]}, replay_count=replays)


@pytest.fixture
def store() -> MemoryDeadLetterStore:
    made = MemoryDeadLetterStore()
    for n in range(30):
        made.add(letter(n, queue="a" if n % 2 else "b", task="charge" if n < 20 else "email",
                        error="billing.Declined" if n % 3 == 0 else "net.Timeout"))
    return made


def test_list_filters_by_queue_task_error_and_time(store: MemoryDeadLetterStore) -> None:
    dlq = DeadLetters(store)
    assert dlq.list(DeadLetterFilter(queue="a")).total == 15
    assert dlq.list(DeadLetterFilter(task_type="em*")).total == 10
    assert dlq.list(DeadLetterFilter(error_type="billing.*")).total == 10
    assert dlq.list(DeadLetterFilter(error_type="billing")).total == 0  # exact, or a pattern
    window = DeadLetterFilter(since=T0 + timedelta(hours=5), until=T0 + timedelta(hours=8))
    assert [x.id for x in dlq.list(window).items] == ["job-5", "job-6", "job-7"]
    naive = DeadLetterFilter(since=datetime(2026, 1, 2, 4))  # naive times are UTC
    assert dlq.list(naive).total == 2
    both = DeadLetterFilter(queue="b", error_type="billing.*", task_type="charge")
    assert {x.id for x in dlq.list(both).items} == {"job-0", "job-6", "job-12", "job-18"}


def test_list_pages_oldest_first(store: MemoryDeadLetterStore) -> None:
    dlq = DeadLetters(store)
    pages = [dlq.list(page=p, per_page=8) for p in (1, 2, 3, 4, 5)]
    assert [len(p.items) for p in pages] == [8, 8, 8, 6, 0]
    assert pages[0].pages == 4 and pages[0].has_next and not pages[3].has_next
    ids = [x.id for p in pages for x in p.items]
    assert ids == [f"job-{n}" for n in range(30)]
    with pytest.raises(ValueError):
        dlq.list(page=0)


def test_show_returns_history_and_payload(store: MemoryDeadLetterStore) -> None:
    shown = DeadLetters(store).show("job-4")
    assert shown is not None and shown.payload == {"args": [4]}
    data = shown.to_dict()
    assert data["history"][0]["type"] == "net.Timeout" and data["payload"] == {"args": [4]}
    assert "payload" not in shown.to_dict(payload=False)
    assert DeadLetters(store).show("job-99") is None


def test_replay_marks_each_job_and_is_idempotent_by_id(store: MemoryDeadLetterStore) -> None:
    dlq = DeadLetters(store)
    first = dlq.replay(["job-1", "job-2", "job-404"])
    assert first.replayed == ("job-1", "job-2") and first.skipped == ("job-404",)
    assert [m.replay_count for _, m in store.requeued] == [1, 1]
    assert dlq.replay(["job-1"]).replayed == ()  # already replayed: nothing happens
    assert len(store.requeued) == 2
    store.add(letter(99, replays=2))
    dlq.replay(DeadLetterFilter(ids=frozenset({"job-99"})))
    assert store.requeued[-1][1].replay_count == 3
    limited = dlq.replay(DeadLetterFilter(queue="a"), limit=3)
    assert limited.replayed == ("job-3", "job-5", "job-7") and limited.skipped == ()


def test_replayed_record_resets_the_attempt_and_keeps_the_history() -> None:
    """A replay starts a new round: attempt 0, the history kept with the closed round's
    entries marked, the round's countdowns emptied (the new round numbers its retries
    from 1), RET-14/RET-15."""
    entry = ErrorEntry(attempt=3, code="HANDLER_ERROR", type="E", message="m",
                       occurred_at="2026-01-01T00:00:00.000Z")
    record = JobRecord(id="j", type="t", queue="q", max_attempts=3, state="discarded",
                       attempt=3, errors=(entry,), dead_lettered=True, outcome="dead_letter",
                       extra={"countdowns": [1.0], "end_reason": "exhausted"})
    again = replayed_record(record, ReplayMark(2, "2026-02-01T00:00:00.000Z"))
    assert (again.state, again.attempt, again.errors, again.dead_lettered) == (
        "retryable", 0, (entry._replace(replay_round=1),), False)
    assert again.to_dict()["replay_count"] == 2 and again.extra["countdowns"] == []
    assert again.to_dict()["last_replayed_at"] == "2026-02-01T00:00:00.000Z"
    assert "end_reason" not in again.extra
    assert again.to_dict()["errors"][0]["replay_round"] == 1
    assert ErrorEntry.from_dict(again.to_dict()["errors"][0]).replay_round == 1


def test_delete_needs_a_selection_and_purge_takes_all(store: MemoryDeadLetterStore) -> None:
    dlq = DeadLetters(store)
    with pytest.raises(ValueError):
        dlq.delete(DeadLetterFilter())
    assert int(dlq.delete(["job-0", "job-1", "nope"])) == 2
    assert int(dlq.delete(DeadLetterFilter(task_type="email"))) == 10
    assert int(dlq.delete([])) == 0
    assert dlq.purge(DeadLetterFilter(error_type="billing.*")) == 6
    assert dlq.purge(DeadLetterFilter(queue="a")) == 6
    assert dlq.purge() == 6 and dlq.list().total == 0


def test_delete_reports_each_dead_letter_it_removed_and_each_id_it_did_not(
        store: MemoryDeadLetterStore) -> None:
    """As ``replay`` does: what a caller needs to tell a typo, or a letter gone meanwhile,
    from a delete without listing the selection first."""
    store.add(replace(letter(4), key="job-4:again"))  # job-4 dead-lettered twice

    class Racing(MemoryDeadLetterStore):
        """Lists job-1, which is gone (replayed by someone else) before it is removed."""

        def scan(self, queue: str | None = None) -> list[DeadLetter]:
            found = super().scan(queue)
            self.letters = [x for x in self.letters if x.id != "job-1"]
            return found

    dlq = DeadLetters(store)
    report = dlq.delete(["job-0", "job-4", "nope"])
    assert report.deleted == ("job-0", "job-4", "job-4") and report.skipped == ("nope",)
    assert int(report) == 3  # the count delete returned before it reported ids
    assert dlq.delete(DeadLetterFilter(task_type="email", queue="a")).deleted == tuple(
        f"job-{n}" for n in range(21, 30, 2))
    assert dlq.delete(["job-0"]) == ((), ("job-0",))  # no longer a dead letter
    racing = Racing()
    racing.add(letter(1))
    racing.add(letter(2))
    raced = DeadLetters(racing).delete(["job-1", "job-2"])
    assert raced.deleted == ("job-2",) and raced.skipped == ("job-1",)


def test_retention_defaults_are_180_days_and_10000_per_queue() -> None:
    assert Retention(max_age=timedelta(days=180), max_count=10_000) == DEFAULT_RETENTION
    with pytest.raises(ValueError):
        Retention(max_count=-1)


def test_retention_prunes_by_age_then_count_per_queue() -> None:
    now = T0 + timedelta(days=200)
    letters = [letter(n, queue="a" if n < 6 else "b", at=T0 + timedelta(days=10 * n))
               for n in range(10)]
    by_age = expired(letters, Retention(max_age=timedelta(days=150), max_count=None), now=now)
    assert [x.id for x in by_age] == ["job-0", "job-1", "job-2", "job-3", "job-4"]
    by_count = expired(letters, Retention(max_age=None, max_count=2), now=now)
    assert [x.id for x in by_count] == ["job-0", "job-1", "job-2", "job-3", "job-6", "job-7"]
    assert expired(letters, Retention(max_age=None, max_count=None), now=now) == []


def test_prune_hook_opens_prunes_and_closes(store: MemoryDeadLetterStore) -> None:
    closed: list[bool] = []

    class Tracked(DeadLetters):
        def close(self) -> None:
            closed.append(True)

    hook = prune_hook(lambda: Tracked(store), Retention(max_age=None, max_count=5))
    assert hook() == 20 and closed == [True]
    assert {x.queue for x in store.scan()} == {"a", "b"} and len(store.scan()) == 10
    assert DeadLetters(store).prune(now=T0) == 0


def test_unknown_framework_is_a_lookup_error() -> None:
    assert "dramatiq" in frameworks()
    with pytest.raises(LookupError, match="no dead-letter backend for 'resque'"):
        open_dead_letter_queue("resque")


def test_core_and_cli_never_import_a_framework() -> None:
    code = ("import sys, ojs_adapters.runtime.dlq, ojs_adapters.runtime.dlq.memory\n"
            "import ojs_adapters.cli\n"
            "from click.testing import CliRunner\n"
            "CliRunner().invoke(ojs_adapters.cli.main, ['dlq', 'list', '--help'])\n"
            "bad = [m for m in sys.modules if m.split('.')[0] in "
            "('celery', 'dramatiq', 'kombu', 'celery_ext', 'dramatiq_ext')]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_store_whose_remove_still_returns_a_count_is_named(
        store: MemoryDeadLetterStore) -> None:
    """``remove`` returns keys now; a store written for the count it returned before gets a
    clear ``TypeError`` naming it, not a ``Counter`` traceback (and no letter is misreported)."""
    class Counting(MemoryDeadLetterStore):
        def remove(self, letters):  # type: ignore[no-untyped-def]
            return len(super().remove(letters))

    counting = Counting()
    counting.add(letter(1))
    with pytest.raises(TypeError, match=r"Counting\.remove returned a count"):
        DeadLetters(counting).delete(["job-1"])
    assert not DeadLetters(store).delete(["no-such-job"])  # bool: nothing removed
