"""Dead-letter management for Celery on a real worker: memory://, Redis and RabbitMQ (issue 7)."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker
from click.testing import CliRunner
from kombu import Queue

from celery_ext import DEAD_LETTER_HEADER, HEADER, OjsTask, get_job_record
from celery_ext._dlq_common import shared
from celery_ext._handoff import TOKEN_HEADER
from celery_ext._headers import HeaderState
from celery_ext.dlq import (
    REPLAY_HEADER,
    JobRecords,
    dead_letter_of,
    dead_letter_queue,
    replay_headers,
    replay_info,
)
from ojs_adapters import ErrorEntry, JobError, JobRecord
from ojs_adapters.cli import main
from ojs_adapters.runtime.dlq import DeadLetterFilter, ReplayMark
from ojs_adapters.runtime.handoff import HEADER_NAMES
from tests.celery_ext.support import Broker, broker_named, wake_for_shutdown
from tests.dlq.scenario import Harness, run_batch_scenario, wait_for

POLICY: dict[str, Any] = {"max_attempts": 1, "on_exhaustion": "dead_letter"}


@dataclass
class Jobs:
    """A worker on one broker, two tasks that fail until healed, and queues to use."""

    broker: Broker
    app: Celery
    free: list[str]
    healed: threading.Event = field(default_factory=threading.Event)
    done: list[int] = field(default_factory=list)
    replays: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: Headers each run of ``retried`` saw, by its argument.
    seen: dict[int, list[dict[str, Any]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.tasks = [self._task(name) for name in ("charge", "email")]
        self.retried = self._retried()

    def _task(self, name: str) -> Any:
        def job(task: Any, n: int) -> None:
            if not self.healed.is_set():
                raise JobError("billing.Declined" if n % 3 == 0 else "net.Timeout", f"job {n}")
            self.replays[n] = replay_info(task.request.headers)
            self.done.append(n)

        return self.app.task(job, shared=False, base=OjsTask, bind=True, retry_policy=POLICY,
                             name=f"{self.app.main}.{name}")

    def _retried(self) -> Any:
        """A task retried once (a hand-off: token and ``x-ojs-*``), then dead-lettered."""
        def job(task: Any, n: int) -> None:
            self.seen.setdefault(n, []).append(dict(task.request.headers or {}))
            if not self.healed.is_set():
                raise JobError("net.Timeout", f"job {n}")

        return self.app.task(job, shared=False, base=OjsTask, bind=True,
                             name=f"{self.app.main}.retried",
                             retry_policy={"max_attempts": 2, "initial_interval": "PT0.1S",
                                           "jitter": False, "on_exhaustion": "dead_letter"})

    def size(self, names: list[str]) -> int:
        """Messages ready in ``names`` (a queue not declared yet holds none)."""
        if self.broker.name == "redis":  # LLEN: a kombu channel per poll starves the worker
            import redis

            client = redis.Redis.from_url(self.broker.url)
            keys = [f"{self.broker.prefix}:{n}{s}" for n in names
                    for s in ("", "\x06\x163", "\x06\x166", "\x06\x169")]
            with client.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.llen(key)
                return sum(pipe.execute())
        total = 0
        with self.app.connection_for_write() as conn:
            for name in names:
                channel = conn.channel()
                try:
                    total += int(channel.queue_declare(name, passive=True).message_count)
                except Exception as exc:
                    if "404" not in str(exc) and "NOT_FOUND" not in str(exc):
                        raise
                finally:
                    with suppress(Exception):
                        channel.close()
        return total

    def harness(self, queues: tuple[str, str]) -> Harness:
        def send(numbers: range) -> None:
            with self.app.producer_or_acquire() as producer:
                for n in numbers:
                    self.tasks[n % 2].apply_async((n,), queue=queues[n % 2], producer=producer)

        return Harness(
            queues=queues, task_types=(self.tasks[0].name, self.tasks[1].name), send=send,
            heal=self.healed.set, successes=lambda: list(self.done),
            live_count=lambda: self.size(list(queues)),
            dead_count=lambda: self.size([f"{q}.dead_letter" for q in queues]),
            open=lambda: dead_letter_queue(self.app, queues=queues),
            record=lambda job_id: get_job_record(job_id, app=self.app))


@pytest.fixture(scope="module", params=["memory", "redis", "amqp"])
def worker(request: pytest.FixtureRequest) -> Iterator[Jobs]:
    """One in-process worker per broker for this module, on queues of its own."""
    broker = broker_named(request.param)
    app = broker.make_app(f"ojs-dlq-{broker.name}")
    # A default queue of its own: the shared broker's celery.dead_letter is not this test's.
    app.conf.task_default_queue = broker.queue_name("default")
    queues = [broker.queue_name(f"d{i}") for i in range(8)]  # each test takes its own
    made = Jobs(broker, app, list(queues))
    quiet = [logging.getLogger(n) for n in ("celery", "celery_ext", "ojs_adapters")]
    levels = [x.level for x in quiet]
    for x in quiet:
        x.setLevel(logging.CRITICAL)
    try:
        with start_worker(app, pool="threads", concurrency=4, perform_ping_check=False,
                          queues=queues, loglevel="CRITICAL", shutdown_timeout=30):
            yield made
            wake_for_shutdown(made.tasks[0], 0, queue=queues[0])
    finally:
        for x, level in zip(quiet, levels, strict=True):
            x.setLevel(level)
        broker.cleanup(app)


@pytest.fixture
def jobs(worker: Jobs) -> Jobs:
    worker.healed.clear()
    worker.done.clear()
    worker.replays.clear()
    worker.seen.clear()
    return worker


@pytest.mark.broker
def test_dead_letter_500_list_replay_250_delete_prune_purge(jobs: Jobs) -> None:
    """Issue 7, "Done when": the whole dead-letter life cycle on a real Celery worker."""
    queues = (jobs.free.pop(), jobs.free.pop())
    dlq = dead_letter_queue(jobs.app, queues=queues)
    try:
        run_batch_scenario(jobs.harness(queues), dlq)
    finally:
        dlq.close()
    # the replay mark travels in the message (header ojs-replay) to the worker
    assert {r.get("replay_count") for r in jobs.replays.values()} == {1}
    assert all(r.get("last_replayed_at") for r in jobs.replays.values())


@pytest.mark.broker
def test_replay_interrupted_mid_batch_loses_and_doubles_nothing(
        jobs: Jobs, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay that dies half-way leaves each job dead or queued once; a rerun finishes it."""
    queue = jobs.free.pop()
    for n in range(0, 40, 2):
        jobs.tasks[0].apply_async((n,), queue=queue)
    dead_queue = f"{queue}.dead_letter"
    wait_for(lambda: jobs.size([dead_queue]) == 20, "20 dead letters")

    monkeypatch.setattr("ojs_adapters.runtime.dlq._queue.REPLAY_BATCH", 5)
    real_mark, calls = JobRecords.mark, []

    def crash_on_eighth(self: JobRecords, *args: Any) -> None:
        calls.append(1)
        if len(calls) == 8:
            raise KeyboardInterrupt("operator pressed Ctrl-C")
        real_mark(self, *args)

    monkeypatch.setattr(JobRecords, "mark", crash_on_eighth)
    jobs.healed.set()
    dlq = dead_letter_queue(jobs.app, queues=[queue])
    with pytest.raises(KeyboardInterrupt):
        dlq.replay(DeadLetterFilter(queue=queue))
    dlq.close()
    # a whole transaction on RabbitMQ; one letter per step on Redis and in memory
    moved = 5 if jobs.broker.name == "amqp" else 7
    wait_for(lambda: len(jobs.done) == moved, f"the {moved} replayed jobs to run")
    assert jobs.size([dead_queue]) == 20 - moved

    monkeypatch.setattr(JobRecords, "mark", real_mark)
    dlq = dead_letter_queue(jobs.app, queues=[queue])
    assert len(dlq.replay(DeadLetterFilter(queue=queue)).replayed) == 20 - moved
    dlq.close()
    wait_for(lambda: len(jobs.done) >= 20, "every job to run again")
    wait_for(lambda: jobs.size([queue]) == 0, "the queue to drain")
    assert sorted(jobs.done) == list(range(0, 40, 2)) and jobs.size([dead_queue]) == 0


@pytest.mark.broker
def test_replay_drops_the_last_runs_handoff_headers(jobs: Jobs) -> None:
    """Issue 11: a replayed job carries no ``x-ojs-*`` header nor copy token of its last run;
    its history, idempotency key and replay count go with it."""
    queue = jobs.free.pop()
    jobs.retried.apply_async((7,), queue=queue, idempotency_key="order-7")
    dead_queue = f"{queue}.dead_letter"
    wait_for(lambda: jobs.size([dead_queue]) == 1, "the dead letter")
    retry_headers = jobs.seen[7][1]  # attempt 2 ran from the retry the hand-off published
    assert {TOKEN_HEADER, *HEADER_NAMES} <= set(retry_headers)
    dlq = dead_letter_queue(jobs.app, queues=[queue])
    try:
        [letter] = dlq.list(DeadLetterFilter(queue=queue)).items
        assert set(HEADER_NAMES) <= set(letter.payload["headers"])  # what a replay must drop
        jobs.healed.set()
        assert len(dlq.replay(DeadLetterFilter(queue=queue)).replayed) == 1
    finally:
        dlq.close()
    wait_for(lambda: len(jobs.seen[7]) == 3, "the replayed job to run")
    replayed = jobs.seen[7][2]
    stale = {TOKEN_HEADER, DEAD_LETTER_HEADER, *HEADER_NAMES} & set(replayed)
    assert not stale, f"stale hand-off headers replayed: {stale}"
    state = HeaderState.from_headers(replayed)
    assert (state.attempt, state.idempotency_key) == (1, "order-7")
    assert [(e.attempt, e.type) for e in state.errors] == [(1, "net.Timeout"), (2, "net.Timeout")]
    assert replay_info(replayed)["replay_count"] == 1


#: The app ``--app tests.dlq.test_celery_dlq:APP`` names while the CLI test runs.
APP: Any = None


@pytest.mark.broker
def test_cli_over_celery_list_show_replay_purge(jobs: Jobs) -> None:
    """``ojs-retry dlq ... --framework celery --app module:app`` through CliRunner."""
    global APP
    APP = jobs.app
    queue = jobs.free.pop()
    for n in (0, 1, 2):
        jobs.tasks[0].apply_async((n,), queue=queue)
    wait_for(lambda: jobs.size([f"{queue}.dead_letter"]) == 3, "3 dead letters")
    options = ["--framework", "celery", "--app", "tests.dlq.test_celery_dlq:APP",
               "--queue", queue, "--json"]

    def run(*args: str) -> Any:
        result = CliRunner().invoke(main, ["dlq", *args, *options])
        assert result.exit_code == 0, result.output
        return json.loads(result.output)

    listed = run("list")
    assert listed["total"] == 3 and {x["queue"] for x in listed["items"]} == {queue}
    first = listed["items"][0]["id"]
    shown = run("show", first)
    assert shown["payload"]["args"] in ([0], [1], [2]) and shown["history"][0]["attempt"] == 1
    assert run("list", "--error-type", "billing.*")["total"] == 1
    jobs.healed.set()
    assert run("replay", first) == {"replayed": [first], "skipped": []}
    wait_for(lambda: len(jobs.done) == 1, "the replayed job to succeed")
    assert run("purge", "--yes") == {"purged": 2}
    assert run("list")["total"] == 0
    APP = None


def test_replay_headers_restart_the_job_and_keep_its_history() -> None:
    """A replayed copy runs as attempt 1 with Celery's retry count, ETA and expiry cleared
    (replayed after its ``expires``, Celery would revoke it unrun)."""
    record = JobRecord(id="t1", type="app.pay", queue="q", max_attempts=2, state="discarded",
                       attempt=2, errors=tuple(ErrorEntry(n, "HANDLER_ERROR", "E", "m",
                                                          "2026-01-01T00:00:00.000Z")
                                               for n in (1, 2)), outcome="dead_letter")
    headers = {"id": "t1", "task": "app.pay", "retries": 1, "eta": "2026-01-01T00:00:01",
               "expires": "2026-01-01T00:00:05",
               HEADER: HeaderState(attempt=2, policy={"max_attempts": 2}).encode(),
               DEAD_LETTER_HEADER: record.to_json(), "x-ojs-error-code": "HANDLER_ERROR",
               "x-death": [{}], REPLAY_HEADER: '{"replay_count": 1}'}
    out = replay_headers(headers, ReplayMark(2, "2026-02-01T00:00:00.000Z"))
    assert (out["retries"], out["eta"], out["expires"], out["id"]) == (0, None, None, "t1")
    assert not {DEAD_LETTER_HEADER, "x-ojs-error-code", "x-death"} & set(out)
    state = HeaderState.from_headers(out)
    assert state.attempt == 1 and [e.attempt for e in state.errors] == [1, 2]
    assert state.policy == {"max_attempts": 2}
    assert replay_info(out) == {"replay_count": 2, "last_replayed_at": "2026-02-01T00:00:00.000Z"}
    letter = dead_letter_of(body=b"not json", content_type="application/json",
                            content_encoding="utf-8", headers=headers, properties={}, queue="q")
    assert letter.payload["embed"] == {"undecodable_body": "not json"}
    assert (letter.attempt, letter.replay_count, letter.error_type) == (2, 1, "E")


@pytest.mark.broker
def test_redis_finds_dead_letters_kept_only_in_a_priority_list(jobs: Jobs) -> None:
    """kombu keeps a message with a priority in ``<queue><sep><priority>``: an app that does
    not know the queue or the workers' priority steps (``--broker`` alone) still finds and
    reads a dead-letter queue holding only those."""
    if jobs.broker.name != "redis":
        pytest.skip("only Redis splits a queue into priority lists")
    queue = jobs.free.pop()
    jobs.tasks[0].apply_async((4,), queue=queue, priority=5)
    wait_for(lambda: jobs.size([f"{queue}.dead_letter"]) == 1, "the dead letter")
    bare = Celery("bare", broker=jobs.broker.url, set_as_current=False)
    # its own priority steps, not the workers': the lists are read as found
    bare.conf.broker_transport_options = {**jobs.broker.transport_options(),
                                          "priority_steps": [0, 9]}
    dlq = dead_letter_queue(bare)
    try:
        found = dlq.list(DeadLetterFilter(queue=queue))
        assert found.total == 1 and found.items[0].queue == queue
        assert queue in dlq.queues()
    finally:
        dlq.close()


def test_a_fixed_dead_letter_queue_name_is_shared_even_if_it_looks_like_a_queue_s_own() -> None:
    """A task's literal ``dead_letter_queue="a.dead_letter"`` gathers other queues' dead
    letters into what looks like queue ``a``'s own: each still keeps its own queue."""
    templates = ["{queue}.dead_letter", "a.dead_letter"]
    assert shared("a.dead_letter", "a", templates)
    assert not shared("b.dead_letter", "b", templates)
    assert not shared("b.dead_letter", "b", ["{queue}.dead_letter"])
    assert shared("dead_letters", "b", ["{queue}.dead_letter", "dead_letters"])


@pytest.mark.broker
def test_two_copies_of_one_dead_letter_are_both_deleted_on_amqp(jobs: Jobs) -> None:
    """A dead letter published again after a crash sits twice in a RabbitMQ dead-letter queue
    with one key: a delete by id removes both copies and reports both, none as gone."""
    if jobs.broker.name != "amqp":
        pytest.skip("the kombu store's one-message-per-key reading is RabbitMQ's")
    queue = jobs.free.pop()
    sent = jobs.tasks[0].apply_async((4,), queue=queue)
    dead = f"{queue}.dead_letter"
    wait_for(lambda: jobs.size([dead]) == 1, "the dead letter")
    with jobs.app.connection_for_write() as connection:
        channel = connection.default_channel
        original = Queue(dead, no_declare=True)(channel).get(no_ack=False)
        producer = connection.Producer(channel)
        producer.publish(original.body, exchange="", routing_key=dead,
                         headers=original.headers, content_type=original.content_type,
                         content_encoding=original.content_encoding, serializer=None)
        original.requeue()
    wait_for(lambda: jobs.size([dead]) == 2, "two copies")
    dlq = dead_letter_queue(jobs.app, queues=[queue])
    try:
        report = dlq.delete([sent.id])
        assert report.deleted == (sent.id, sent.id) and report.skipped == ()
        assert jobs.size([dead]) == 0
    finally:
        dlq.close()
