"""The issue-7 dead-letter scenario, written once for every framework and broker.

A ``Harness`` gives the scenario a framework's dead letters and a way to send,
heal and count jobs; ``run_batch_scenario`` then dead-letters 500 jobs, lists,
filters and shows them, replays 250 (each must run again and succeed once),
deletes, prunes by count and by age, purges the rest, and checks the broker
ends with exactly the jobs expected.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from ojs_adapters import JobRecord
from ojs_adapters.runtime.dlq import DeadLetterFilter, DeadLetterQueue, Retention, prune_hook

#: Jobs dead-lettered by the scenario, and how many of them are replayed.
BATCH, REPLAYED = 500, 250


def error_type_of(n: int) -> str:
    """The error job ``n`` dies of: a third billing errors, the rest network ones."""
    return "billing.Declined" if n % 3 == 0 else "net.Timeout"


@dataclass
class Harness:
    """What the scenario needs of one framework on one broker.

    ``queues``/``task_types``: job n goes to ``queues[n % 2]`` as ``task_types[n % 2]``.
    ``send(ns)`` sends jobs; ``heal()`` makes every later run succeed; ``successes()``
    the job numbers that ran successfully (repeats included); ``live_count()`` the
    messages still waiting in the live queues; ``dead_count()`` in the dead-letter
    queues, both read from the broker directly; ``open()`` a fresh ``DeadLetterQueue``;
    ``record(id)`` the job record; ``record_keeps_replay`` whether it still shows the
    replay after the job ran again.
    """

    queues: tuple[str, str]
    task_types: tuple[str, str]
    send: Callable[[range], None]
    heal: Callable[[], None]
    successes: Callable[[], list[int]]
    live_count: Callable[[], int]
    dead_count: Callable[[], int]
    open: Callable[[], DeadLetterQueue]
    record: Callable[[str], JobRecord | None]
    record_keeps_replay: bool = True


def wait_for(check: Callable[[], bool], what: str, timeout: float = 20.0,
             status: Callable[[], object] | None = None) -> None:
    """Poll ``check`` until true; on timeout, fail with ``status()`` to show where it stood."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            seen = f" (seen: {status()})" if status is not None else ""
            raise AssertionError(f"timed out waiting for {what}{seen}")
        time.sleep(0.05)


def counts(h: Harness) -> str:
    """Where the jobs are, read off the broker: for a failure message."""
    return f"live={h.live_count()} dead={h.dead_count()} ok={len(h.successes())}"


def run_batch_scenario(h: Harness, dlq: DeadLetterQueue) -> None:
    qa, qb = h.queues
    h.send(range(BATCH))
    wait_for(lambda: h.dead_count() == BATCH, f"{BATCH} dead letters", timeout=60,
             status=lambda: counts(h))

    # list, filter, page, show
    everything = dlq.list(per_page=BATCH)
    assert everything.total == BATCH and len(everything.items) == BATCH
    pages = [dlq.list(per_page=128, page=p) for p in range(1, 5)]
    assert [len(p.items) for p in pages] == [128, 128, 128, 116] and pages[0].pages == 4
    assert len({x.id for p in pages for x in p.items}) == BATCH
    assert dlq.list(DeadLetterFilter(queue=qa)).total == BATCH // 2
    assert dlq.list(DeadLetterFilter(task_type=h.task_types[1])).total == BATCH // 2
    billing = sum(1 for n in range(BATCH) if error_type_of(n) == "billing.Declined")
    assert dlq.list(DeadLetterFilter(error_type="billing.*")).total == billing
    assert dlq.list(DeadLetterFilter(error_type="net.Timeout", queue=qb)).total == sum(
        1 for n in range(1, BATCH, 2) if error_type_of(n) == "net.Timeout")
    times = sorted(x.dead_lettered_at for x in everything.items)
    pivot = times[BATCH // 2]
    older = sum(1 for t in times if t < pivot)
    assert dlq.list(DeadLetterFilter(until=pivot)).total == older
    assert dlq.list(DeadLetterFilter(since=pivot)).total == BATCH - older
    one = everything.items[0]
    shown = dlq.show(one.id)
    assert shown is not None and shown.id == one.id and shown.payload
    assert [e.attempt for e in shown.history] == [1] and shown.attempt == 1
    assert shown.history[0].type == shown.error_type and shown.error_code == "HANDLER_ERROR"
    assert dlq.show("no-such-job") is None

    # replay the 250 of queue A: each runs again, once, and succeeds
    h.heal()
    report = dlq.replay(DeadLetterFilter(queue=qa))
    assert len(report.replayed) == REPLAYED and not report.skipped
    again = dlq.replay(list(report.replayed))
    assert again.replayed == () and set(again.skipped) == set(report.replayed)
    expected = set(range(0, BATCH, 2))
    wait_for(lambda: set(h.successes()) == expected, "the replayed jobs to succeed")
    wait_for(lambda: h.live_count() == 0, "the live queues to drain")
    counts = Counter(h.successes())
    assert set(counts) == expected and set(counts.values()) == {1}, "a replayed job ran twice"
    for job_id in report.replayed[:5]:
        record = h.record(job_id)
        assert record is not None and record.state == "completed", record
        if h.record_keeps_replay:
            assert record.extra["replay_count"] == 1 and record.extra["last_replayed_at"]
        assert not record.dead_lettered and record.attempt == 1
        assert [e.attempt for e in record.errors] == [1]  # the history is kept
    assert dlq.list().total == BATCH - REPLAYED

    # delete 25 by id, prune by count (hook) and by age, purge by filter, purge the rest
    rest = dlq.list(per_page=BATCH).items
    assert {x.queue for x in rest} == {qb}
    gone = dlq.delete([x.id for x in rest[-25:]])  # each broker store names what it removed
    assert sorted(gone.deleted) == sorted(x.id for x in rest[-25:]) and gone.skipped == ()
    assert dlq.delete(["no-such-job"]) == ((), ("no-such-job",))
    hook = prune_hook(h.open, Retention(max_age=None, max_count=200))
    assert hook() == 25
    left = dlq.list(per_page=BATCH).items
    assert len(left) == 200 and [x.id for x in left] == [x.id for x in rest[25:-25]]
    stamp = sorted(x.dead_lettered_at for x in left)[50]
    old = [x for x in left if x.dead_lettered_at < stamp]
    rule = Retention(max_age=timedelta(days=1), max_count=None)
    assert dlq.prune(rule, now=stamp + timedelta(days=1)) == len(old)
    assert dlq.prune(Retention()) == 0  # the defaults: nothing is 180 days old
    left = dlq.list(per_page=BATCH).items
    assert len(left) == 200 - len(old) and min(x.dead_lettered_at for x in left) >= stamp
    billing_left = sum(1 for x in left if x.error_type == "billing.Declined")
    assert dlq.purge(DeadLetterFilter(error_type="billing.*")) == billing_left
    assert dlq.purge() == len(left) - billing_left

    # the broker ends with exactly what is expected: nothing dead, nothing waiting
    assert dlq.list().total == 0 and h.dead_count() == 0 and h.live_count() == 0
    assert Counter(h.successes()) == Counter(expected)
