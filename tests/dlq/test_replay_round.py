"""A replayed dead letter starts a new round, the same on Celery and Dramatiq, on real workers.

ojs-retry.md section 2.2 sends a dead-lettered job to the dead-letter queue "for manual
inspection and possible re-enqueue"; section 10 (RET-14, RET-15) keeps its attempt count
and error history. A replay is that re-enqueue: the job gets a fresh attempt budget
(``max_attempts`` counts from 1 again), its record stops saying dead-lettered the moment
it is replayed (nothing of the dead round's end is left on it), and its history is kept
with each closed round's entries marked (``replay_round``), so the console's timeline
shows where the new round starts.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any, Protocol

import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

from ojs_adapters import JobError, JobRecord
from ojs_adapters.cli import main
from ojs_adapters.runtime.dlq import DeadLetterFilter, DeadLetters
from ojs_adapters.web import ConsoleSettings, create_app
from ojs_adapters.web._pages import timeline
from tests.dlq.scenario import wait_for

#: Two attempts per round, then the dead-letter queue.
POLICY: dict[str, Any] = {"max_attempts": 2, "initial_interval": "PT0.1S", "jitter": False,
                          "on_exhaustion": "dead_letter"}
#: The app or broker ``--app tests.dlq.test_replay_round:TARGET`` names while a test runs.
TARGET: Any = None
#: What the dead round's end leaves on a record, none of which a new round's may show.
DEAD_ROUND_KEYS = {"handed_off", "end_reason", "dead_letter_queue"}


class Side(Protocol):
    """One framework on one broker: a job that fails until healed, its workers, its DLQ."""

    framework: str
    target: Any  # the Celery app or Dramatiq broker, for ``--app`` (``TARGET``)
    queue: str
    healed: threading.Event
    attempts: list[int]  # the attempt number each run of the job saw

    def send(self) -> str: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...
    def record(self, job_id: str) -> JobRecord | None: ...
    def dead_letters(self) -> DeadLetters: ...
    def console(self) -> Any: ...


@contextmanager
def celery_side(broker_name: str) -> Iterator[Side]:
    from celery.contrib.testing.worker import start_worker

    from celery_ext import OjsTask, get_job_record
    from celery_ext._console import CeleryConsole
    from celery_ext.dlq import dead_letter_queue
    from tests.celery_ext.support import broker_named, wake_for_shutdown

    broker = broker_named(broker_name)
    app = broker.make_app(f"ojs-round-{broker.name}")
    queue = broker.queue_name("round")
    app.conf.task_default_queue = queue

    class CelerySide:
        framework = "celery"
        target = app

        def __init__(self) -> None:
            self.queue = queue
            self.healed, self.attempts = threading.Event(), list[int]()
            self.workers = ExitStack()

            def job(task: Any) -> None:
                self.attempts.append(task.ojs.attempt)
                if not self.healed.is_set():
                    raise JobError("net.Timeout", "down")

            self.task = app.task(job, shared=False, base=OjsTask, bind=True,
                                 retry_policy=POLICY, name=f"{app.main}.job")
            def noop() -> None:
                pass

            self.noop = app.task(noop, shared=False, name=f"{app.main}.noop")

        def send(self) -> str:
            return str(self.task.apply_async(queue=queue).id)

        def start(self) -> None:
            self.workers.enter_context(start_worker(
                app, pool="threads", concurrency=2, perform_ping_check=False, queues=[queue],
                loglevel="CRITICAL", shutdown_timeout=30))

        def stop(self) -> None:
            wake_for_shutdown(self.noop, queue=queue)
            self.workers.close()

        def record(self, job_id: str) -> JobRecord | None:
            return get_job_record(job_id, app=app)

        def dead_letters(self) -> DeadLetters:
            return dead_letter_queue(app, queues=[queue])

        def console(self) -> Any:
            return CeleryConsole(self.dead_letters())

    side = CelerySide()
    try:
        yield side
    finally:
        side.workers.close()
        broker.cleanup(app)


@contextmanager
def dramatiq_side(broker_name: str, urls: dict[str, str]) -> Iterator[Side]:
    from dramatiq.middleware import CurrentMessage

    from dramatiq_ext._console import DramatiqConsole
    from dramatiq_ext._state import MessageState
    from dramatiq_ext.dlq import dead_letter_queue
    from tests.dramatiq_ext.harness import make_env

    with make_env(broker_name, extra=[CurrentMessage()],
                  **urls) as env:  # type: ignore[arg-type]

        class DramatiqSide:
            framework = "dramatiq"
            target = env.broker

            def __init__(self) -> None:
                self.queue = env.queue
                self.healed, self.attempts = threading.Event(), list[int]()

                def job() -> None:
                    message = CurrentMessage.get_current_message()
                    assert message is not None
                    self.attempts.append(MessageState.of(message.options).attempt)
                    if not self.healed.is_set():
                        raise JobError("net.Timeout", "down")

                self.actor = env.actor(job, retry_policy=POLICY)

            def send(self) -> str:
                return str(self.actor.send().message_id)

            def start(self) -> None:
                env.start()

            def stop(self) -> None:
                for worker in env.workers:
                    worker.stop(timeout=5000)
                env.workers.clear()

            def record(self, job_id: str) -> JobRecord | None:
                return env.record(job_id)

            def dead_letters(self) -> DeadLetters:
                return dead_letter_queue(env.broker, queues=[env.queue])

            def console(self) -> Any:
                return DramatiqConsole(self.dead_letters())

        side = DramatiqSide()
        try:
            yield side
        finally:
            side.stop()


@pytest.fixture(params=[("celery", "redis"), ("celery", "amqp"), ("dramatiq", "redis"),
                        ("dramatiq", "rabbitmq")], ids=lambda p: "-".join(p))
def side(request: pytest.FixtureRequest) -> Iterator[Side]:
    framework, broker_name = request.param
    urls = {"redis_url": request.getfixturevalue("redis_url")}
    if broker_name in ("amqp", "rabbitmq"):
        urls["amqp_url"] = request.getfixturevalue("amqp_url")
    quiet = [logging.getLogger(n) for n in ("celery", "celery_ext", "dramatiq", "dramatiq_ext",
                                            "ojs_adapters")]
    levels = [x.level for x in quiet]
    for x in quiet:
        x.setLevel(logging.CRITICAL)
    made = celery_side(broker_name) if framework == "celery" else dramatiq_side(broker_name,
                                                                                  urls)
    try:
        with made as found:
            yield found
    finally:
        for x, level in zip(quiet, levels, strict=True):
            x.setLevel(level)


def replay(side: Side, job_id: str) -> None:
    dlq = side.dead_letters()
    try:
        wait_for(lambda: dlq.list(DeadLetterFilter(ids=frozenset({job_id}))).total == 1,
                 "the dead letter")
        assert dlq.replay([job_id]).replayed == (job_id,)
    finally:
        dlq.close()


def settled(side: Side, job_id: str, done: Callable[[JobRecord], bool]) -> JobRecord:
    found: list[JobRecord] = []

    def check() -> bool:
        record = side.record(job_id)
        found[:] = [record] if record is not None else []
        return record is not None and done(record)

    wait_for(check, "the job record", status=lambda: found)
    return found[0]


def rounds_of(record: JobRecord) -> list[tuple[int, int | None]]:
    return [(e.attempt, e.replay_round) for e in record.errors]


@pytest.mark.broker
def test_a_replayed_dead_letter_starts_a_new_round(side: Side) -> None:
    """RET-14/RET-15 across a replay, on both frameworks alike: a fresh budget of
    ``max_attempts``, the record no longer dead-lettered from the replay on, the history
    kept with each closed round marked, and the timeline showing where a round starts."""
    side.start()
    job_id = side.send()
    dead = settled(side, job_id, lambda r: r.dead_lettered and r.extra.get("handed_off")
                   == "dead_letter")
    assert [e.attempt for e in dead.errors] == [1, 2] and side.attempts == [1, 2]
    side.stop()  # the replayed job waits: the replay's own record is read

    replay(side, job_id)
    stamped = side.record(job_id)
    assert stamped is not None
    assert (stamped.state, stamped.attempt, stamped.dead_lettered, stamped.outcome) == \
        ("retryable", 0, False, None), stamped
    stale = DEAD_ROUND_KEYS & set(stamped.extra)
    assert not stale, f"the dead round's {stale} kept on the replayed record: {stamped.extra}"
    assert all(not stamped.extra.get(k) for k in ("countdowns", "delays_ms", "jitter_samples"))
    assert stamped.extra["replay_count"] == 1
    assert rounds_of(stamped) == [(1, 0), (2, 0)]  # the history, its dead round marked

    side.start()  # still failing: a whole new budget of 2 attempts, then dead again
    again = settled(side, job_id, lambda r: r.dead_lettered and len(r.errors) == 4
                    and r.extra.get("handed_off") == "dead_letter")
    assert side.attempts == [1, 2, 1, 2]
    assert (again.attempt, again.extra["replay_count"]) == (2, 1)
    assert rounds_of(again) == [(1, 0), (2, 0), (1, None), (2, None)]
    rows = timeline(again)
    assert [r["new_round"] for r in rows] == [False, False, True, False]
    assert [r["round"] for r in rows] == [0, 0, 1, 1]
    assert rows[1]["gap"] is None and rows[2]["gap"] is not None  # no gap across rounds
    app = create_app(ConsoleSettings(framework=side.framework), opener=side.console)
    page = TestClient(app).get(f"/jobs?id={job_id}").text
    assert page.count("round 1 starts") == 1, page
    shows_its_rounds(side, job_id, app)

    side.stop()
    side.healed.set()
    replay(side, job_id)
    side.start()
    done = settled(side, job_id, lambda r: r.state == "completed")
    assert side.attempts == [1, 2, 1, 2, 1]
    assert (done.attempt, done.outcome, done.extra["replay_count"]) == (1, "completed", 2)
    assert rounds_of(done) == [(1, 0), (2, 0), (1, 1), (2, 1)]
    assert not {"end_reason", "dead_letter_queue"} & set(done.extra), done.extra


def shows_its_rounds(side: Side, job_id: str, app: Any) -> None:
    """The dead letter of a job dead in two rounds: ``ojs-retry dlq show`` and the console's
    dead-letter page mark where round 1 starts, as the job timeline does."""
    global TARGET
    dlq = side.dead_letters()
    try:
        wait_for(lambda: len(getattr(dlq.show(job_id), "history", ())) == 4,
                 "the second dead letter")
    finally:
        dlq.close()
    page = TestClient(app).get(f"/dead-letter?id={job_id}&queue={side.queue}").text
    assert page.count("round 1 starts") == 1, page
    rows = page[page.index('<table id="history">'):page.index("</table>")]
    assert rows.index("round 1 starts") > rows.index("<td>2</td>")  # after round 0's two

    TARGET = side.target
    try:
        shown = CliRunner().invoke(main, ["dlq", "show", job_id, "--framework", side.framework,
                                          "--app", "tests.dlq.test_replay_round:TARGET",
                                          "--queue", side.queue])
    finally:
        TARGET = None
    assert shown.exit_code == 0, shown.output
    history = shown.stdout.split("history:\n")[1].splitlines()[:5]
    assert [line.split()[:2] for line in history] == [
        ["attempt", "1"], ["attempt", "2"], ["--", "replayed"], ["attempt", "1"],
        ["attempt", "2"]], shown.stdout
    assert "round 1 starts" in history[2]
