"""Dead-letter management for Dramatiq on a real worker: StubBroker, Redis, RabbitMQ (issue 7)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import dramatiq
import pytest
from dramatiq.middleware import CurrentMessage

from dramatiq_ext import MemoryRecordStore, OjsRetries
from dramatiq_ext._console import DramatiqConsole
from dramatiq_ext._handoff import TOKEN_OPTION
from dramatiq_ext._state import MessageState
from dramatiq_ext.dlq import JobRecords, dead_letter_queue
from ojs_adapters import JobError, JobRecord
from ojs_adapters.runtime.dlq import DeadLetterFilter, DeadLetters
from ojs_adapters.runtime.handoff import HANDED_OFF, HEADER_NAMES
from tests.dlq.scenario import Harness, run_batch_scenario, wait_for
from tests.dramatiq_ext.harness import Env, make_env

BROKERS = ["stub", "redis", "rabbitmq"]
#: Every job runs once and, failing, goes straight to the dead-letter queue.
POLICY: dict[str, Any] = {"max_attempts": 1, "on_exhaustion": "dead_letter"}


@dataclass
class Jobs:
    """Two actors on two queues that fail until healed, counting their successes."""

    env: Env
    healed: threading.Event = field(default_factory=threading.Event)
    done: list[int] = field(default_factory=list)
    connection: Any = None

    def __post_init__(self) -> None:
        self.queues = (self.env.queue, f"{self.env.queue}_b")
        self.actors = [self._actor(name, queue) for name, queue in
                       zip(("charge", "email"), self.queues, strict=True)]

    def _actor(self, name: str, queue: str) -> Any:
        def job(n: int) -> None:
            if not self.healed.is_set():
                raise JobError("billing.Declined" if n % 3 == 0 else "net.Timeout", f"job {n}")
            self.done.append(n)

        return dramatiq.actor(broker=self.env.broker, queue_name=queue,
                              actor_name=f"{name}_{self.env.queue}", retry_policy=POLICY)(job)

    def send(self, numbers: range) -> None:
        for n in numbers:
            self.actors[n % 2].send(n)

    def count(self, suffixes: tuple[str, ...]) -> int:
        names = [q + s for q in self.queues for s in suffixes]
        broker = self.env.broker
        if self.env.kind == "stub":
            if suffixes == (".XQ",):
                return sum(len(broker.dead_letters_by_queue[q]) for q in self.queues)
            return sum(broker.queues[n].qsize() for n in names if n in broker.queues)
        if self.env.kind == "redis":
            ns = self.env.namespace
            if suffixes == (".XQ",):
                return sum(self.env.redis.zcard(f"{ns}:{n}") for n in names)
            return sum(self.env.redis.hlen(f"{ns}:{n}.msgs") for n in names)
        return sum(self._ready(n) for n in names)

    def _ready(self, name: str) -> int:
        """Messages ready in RabbitMQ queue ``name``; 0 if the worker has not declared it yet."""
        import pika
        from pika.exceptions import ChannelClosedByBroker

        if self.connection is None:
            self.connection = pika.BlockingConnection(self.env.broker.parameters)
        channel = self.connection.channel()
        try:
            return int(channel.queue_declare(name, passive=True).method.message_count)
        except ChannelClosedByBroker as exc:  # a 404 closes the channel, not the connection
            if exc.reply_code != 404:
                raise
            return 0
        finally:
            if channel.is_open:
                channel.close()

    def harness(self) -> Harness:
        return Harness(
            queues=self.queues, task_types=(self.actors[0].actor_name, self.actors[1].actor_name),
            send=self.send, heal=self.healed.set, successes=lambda: list(self.done),
            live_count=lambda: self.count(("", ".DQ")), dead_count=lambda: self.count((".XQ",)),
            open=lambda: dead_letter_queue(self.env.broker), record=self.env.record)


@contextmanager
def quiet() -> Iterator[None]:
    """Silence the 500 expected failure tracebacks (formatting them costs seconds)."""
    loggers = [logging.getLogger(n) for n in ("dramatiq", "dramatiq_ext", "ojs_adapters")]
    levels = [x.level for x in loggers]
    for x in loggers:
        x.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for x, level in zip(loggers, levels, strict=True):
            x.setLevel(level)


@pytest.fixture(params=BROKERS)
def jobs(request: pytest.FixtureRequest) -> Iterator[Jobs]:
    kind = request.param
    urls: dict[str, str] = {}
    if kind != "stub":
        urls["redis_url"] = request.getfixturevalue("redis_url")
    if kind == "rabbitmq":
        urls["amqp_url"] = request.getfixturevalue("amqp_url")
    # An explicit store: the default memory store is created lazily per worker thread.
    ojs = OjsRetries(store=MemoryRecordStore()) if kind == "stub" else None
    with quiet(), make_env(kind, ojs=ojs, **urls) as env:  # type: ignore[arg-type]
        made = Jobs(env)
        try:
            yield made
        finally:
            if made.connection is not None:
                made.connection.close()
            if kind == "rabbitmq":
                for worker in env.workers:
                    worker.stop(timeout=5000)
                env.workers.clear()
                for suffix in ("", ".DQ", ".XQ"):
                    env.broker.channel.queue_delete(made.queues[1] + suffix)


@pytest.mark.broker
def test_dead_letter_500_list_replay_250_delete_prune_purge(jobs: Jobs) -> None:
    """Issue 7, "Done when": the whole dead-letter life cycle on a real worker."""
    jobs.env.start(threads=4)
    dlq = dead_letter_queue(jobs.env.broker)
    try:
        run_batch_scenario(jobs.harness(), dlq)
    finally:
        dlq.close()


@pytest.mark.broker
def test_replay_interrupted_mid_batch_loses_and_doubles_nothing(
        jobs: Jobs, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay that dies half-way leaves each job dead or queued once; a rerun finishes it."""
    jobs.env.start(threads=2)
    jobs.send(range(0, 40, 2))  # 20 jobs, all on the first queue
    wait_for(lambda: jobs.count((".XQ",)) == 20, "20 dead letters")
    for worker in jobs.env.workers:
        worker.stop(timeout=5000)
    jobs.env.workers.clear()

    monkeypatch.setattr("ojs_adapters.runtime.dlq._queue.REPLAY_BATCH", 5)
    real_mark, calls = JobRecords.mark, []

    def crash_on_eighth(self: JobRecords, *args: Any) -> None:
        calls.append(1)
        if len(calls) == 8:
            raise KeyboardInterrupt("operator pressed Ctrl-C")
        real_mark(self, *args)

    monkeypatch.setattr(JobRecords, "mark", crash_on_eighth)
    dlq: DeadLetters = dead_letter_queue(jobs.env.broker)
    with pytest.raises(KeyboardInterrupt):
        dlq.replay(DeadLetterFilter(queue=jobs.queues[0]))
    dlq.close()
    live, dead = jobs.count(("", ".DQ")), jobs.count((".XQ",))
    assert live + dead == 20
    # whole batches on Redis (one script) and RabbitMQ (one transaction); one by one in memory
    assert live == (7 if jobs.env.kind == "stub" else 5)

    monkeypatch.setattr(JobRecords, "mark", real_mark)
    dlq = dead_letter_queue(jobs.env.broker)
    report = dlq.replay(DeadLetterFilter(queue=jobs.queues[0]))
    dlq.close()
    assert len(report.replayed) == 20 - live
    jobs.healed.set()
    jobs.env.start(threads=2)
    wait_for(lambda: len(jobs.done) >= 20, "every job to run again")
    wait_for(lambda: jobs.count(("", ".DQ")) == 0, "the queue to drain")
    assert sorted(jobs.done) == list(range(0, 40, 2)) and jobs.count((".XQ",)) == 0


@pytest.fixture(params=BROKERS)
def seen_env(request: pytest.FixtureRequest) -> Iterator[Env]:
    """An env whose actors can read the message they run (``CurrentMessage``)."""
    kind = request.param
    urls: dict[str, str] = {}
    if kind != "stub":
        urls["redis_url"] = request.getfixturevalue("redis_url")
    if kind == "rabbitmq":
        urls["amqp_url"] = request.getfixturevalue("amqp_url")
    ojs = OjsRetries(store=MemoryRecordStore()) if kind == "stub" else None
    with quiet(), make_env(kind, ojs=ojs, extra=[CurrentMessage()], **urls) as env:  # type: ignore[arg-type]
        yield env


@pytest.mark.broker
def test_replay_drops_the_last_runs_handoff_options(seen_env: Env) -> None:
    """Issue 11: a replayed job carries no ``x-ojs-*`` option nor copy token of its last run;
    its history, idempotency key and replay count go with it."""
    env, healed, seen = seen_env, threading.Event(), []

    def job(n: int) -> None:
        message = CurrentMessage.get_current_message()
        assert message is not None
        seen.append(dict(message.options))
        if not healed.is_set():
            raise JobError("net.Timeout", f"job {n}")

    actor = env.actor(job, retry_policy={"max_attempts": 2, "initial_interval": "PT0.1S",
                                         "jitter": False, "on_exhaustion": "dead_letter"})
    env.start()
    actor.send_with_options(args=(7,), idempotency_key="order-7")
    dlq = dead_letter_queue(env.broker)
    try:
        wait_for(lambda: dlq.list(DeadLetterFilter(queue=env.queue)).total == 1,
                 "the dead letter")
        [letter] = dlq.list(DeadLetterFilter(queue=env.queue)).items
        assert {TOKEN_OPTION, *HEADER_NAMES} <= set(seen[1])  # attempt 2 came by a hand-off
        assert {TOKEN_OPTION, *HEADER_NAMES} <= set(letter.payload["options"])
        healed.set()
        assert len(dlq.replay(DeadLetterFilter(queue=env.queue)).replayed) == 1
    finally:
        dlq.close()
    wait_for(lambda: len(seen) == 3, "the replayed job to run")
    stale = {TOKEN_OPTION, *HEADER_NAMES} & set(seen[2])
    assert not stale, f"stale hand-off options replayed: {stale}"
    state = MessageState.of(seen[2])
    assert (state.attempt, state.replay_count) == (1, 1)
    assert [(e.attempt, e.type) for e in state.errors] == [(1, "net.Timeout"), (2, "net.Timeout")]
    assert seen[2]["idempotency_key"] == "order-7"


@pytest.mark.broker
def test_a_replayed_jobs_record_starts_a_new_round_as_celery_s_does(seen_env: Env) -> None:
    """After a replay, the job record keeps the history, idempotency key and replay count,
    and no longer shows what the dead round left beside ``dead_lettered: false``: the dead
    letter's ``handed_off`` mark, the old round's retry delays (``countdowns``, ``delays_ms``:
    empty, as a replayed Celery attempt's record built from fresh headers has them) and its
    end reason. So it reads from the replay on, and after the replayed run."""
    env, healed = seen_env, threading.Event()

    def job(n: int) -> None:
        if not healed.is_set():
            raise JobError("net.Timeout", f"job {n}")

    actor = env.actor(job, retry_policy={"max_attempts": 2, "initial_interval": "PT0.1S",
                                         "jitter": False, "on_exhaustion": "dead_letter"})
    env.start()
    sent = actor.send_with_options(args=(7,), idempotency_key="order-7")
    dead = env.wait_record(sent.message_id, done=lambda r: r.extra.get(HANDED_OFF) is not None
                           and r.dead_lettered)
    assert dead.extra["countdowns"] == [0.1] and dead.extra["end_reason"] == "exhausted"
    for worker in env.workers:  # the replayed job waits: the replay's own record is read
        worker.stop(timeout=5000)
    env.workers.clear()

    def new_round(record: JobRecord) -> None:
        assert not record.dead_lettered and record.extra["replay_count"] == 1, record
        assert [e.attempt for e in record.errors] == [1, 2]  # the history is kept
        assert record.extra["idempotency_key"] == "order-7"
        stale = {HANDED_OFF, "end_reason"} & set(record.extra)
        assert not stale, f"the dead round's {stale} kept: {record.extra}"
        assert (record.extra["countdowns"], record.extra["delays_ms"]) == ([], []), record.extra

    dlq = dead_letter_queue(env.broker)
    try:
        wait_for(lambda: dlq.list(DeadLetterFilter(queue=env.queue)).total == 1,
                 "the dead letter")
        assert dlq.replay([sent.message_id]).replayed == (sent.message_id,)
    finally:
        dlq.close()
    stamped = env.record(sent.message_id)
    assert stamped is not None and (stamped.state, stamped.attempt) == ("retryable", 0)
    new_round(stamped)
    healed.set()
    env.start()
    done = env.wait_record(sent.message_id, done=lambda r: r.state == "completed")
    assert (done.attempt, done.outcome) == (1, "completed")
    new_round(done)


@pytest.mark.broker
def test_a_dead_message_dramatiq_cannot_decode_is_listed_and_deletable_not_in_the_way(
        seen_env: Env) -> None:
    """Another producer's bytes in ``.XQ`` (Dramatiq's consumer rejects them there) list as
    an undecodable dead letter with their text: the queue's real dead letters still list,
    replay and delete, and the stranger can be deleted; a replay leaves it where it is."""
    env = seen_env
    if env.kind == "stub":
        pytest.skip("StubBroker keeps dead letters as decoded messages")
    env.actor(lambda: None).send()  # declares the queue and its .XQ (no worker runs it)
    garbage = b"\x00not a dramatiq message"
    if env.kind == "redis":
        env.redis.zadd(f"{env.namespace}:{env.queue}.XQ", {"stranger": 1_700_000_000_000})
        env.redis.hset(f"{env.namespace}:{env.queue}.XQ.msgs", "stranger", garbage)
    else:
        env.broker.channel.basic_publish(exchange="", routing_key=f"{env.queue}.XQ",
                                         body=garbage)
    dlq = dead_letter_queue(env.broker, queues=[env.queue])
    try:
        wait_for(lambda: dlq.list(DeadLetterFilter(queue=env.queue)).total == 1, "the stranger")
        [stranger] = dlq.list(DeadLetterFilter(queue=env.queue)).items
        assert stranger.payload["undecodable_body"].endswith("not a dramatiq message")
        console = DramatiqConsole(dlq)  # the console's own broker-side reads, too
        for filters in (DeadLetterFilter(queue=env.queue),
                        DeadLetterFilter(queue=env.queue, task_type="x*")):
            console.letters(filters)
        assert console.letters(DeadLetterFilter(queue=env.queue)).total == 1
        assert console.letter(stranger.id, env.queue, stranger.key) is not None
        report = dlq.replay([stranger.id])
        assert report.replayed == () and report.skipped == (stranger.id,)
        assert dlq.list(DeadLetterFilter(queue=env.queue)).total == 1
        assert dlq.delete([stranger.id]).deleted == (stranger.id,)
        assert dlq.list(DeadLetterFilter(queue=env.queue)).total == 0
    finally:
        dlq.close()


@pytest.mark.broker
def test_two_copies_of_one_dead_letter_are_both_deleted(seen_env: Env) -> None:
    """A dead letter published again after a crash sits twice in ``.XQ`` with one key: a
    delete by id removes both copies and reports both, none as gone."""
    env = seen_env
    if env.kind != "rabbitmq":
        pytest.skip("only a RabbitMQ .XQ holds two messages with one key")
    actor = env.actor(lambda: None)
    actor.send()  # declares the queue and its .XQ (no worker runs it)
    message = actor.message()
    for _ in range(2):
        env.broker.channel.basic_publish(exchange="", routing_key=f"{env.queue}.XQ",
                                         body=message.encode())
    dlq = dead_letter_queue(env.broker, queues=[env.queue])
    try:
        wait_for(lambda: dlq.list(DeadLetterFilter(queue=env.queue)).total == 2, "two copies")
        report = dlq.delete([message.message_id])
        assert report.deleted == (message.message_id, message.message_id)
        assert report.skipped == ()
        assert dlq.list(DeadLetterFilter(queue=env.queue)).total == 0
    finally:
        dlq.close()
