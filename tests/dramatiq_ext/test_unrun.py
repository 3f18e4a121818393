"""Deliveries that end outside a decision: skipped, interrupted, or not admitted (RET-12).

Each runs a real worker on StubBroker, Redis and RabbitMQ (records in ``Results`` there).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from dramatiq.middleware import Callbacks, Middleware, MiddlewareError, Shutdown, SkipMessage

from dramatiq_ext import get_job_record
from dramatiq_ext import middleware as ojs_middleware
from tests.dramatiq_ext.harness import Env, crashed_attempt


class Gate(Middleware):
    """Skips (and fails, if asked) the messages whose kwargs say so, after OjsRetries."""

    def before_process_message(self, broker: Any, message: Any) -> None:
        if message.kwargs.get("drop"):
            message.fail()
            raise SkipMessage("dropped by the gate")


def test_a_skipped_job_ends_its_record_saying_so(env: Env) -> None:
    env.broker.add_middleware(Gate())

    def job(skip: bool = False, drop: bool = False) -> None:
        if skip:
            raise SkipMessage("the actor skipped itself")

    actor = env.actor(job)
    skipped, dropped = actor.send(skip=True), actor.send(drop=True)
    env.start()
    one = env.wait_record(skipped.message_id)
    two = env.wait_record(dropped.message_id)
    assert (one.state, one.outcome, one.dead_lettered, one.attempt) == (
        "discarded", "discarded", False, 1)
    assert one.extra["end_reason"] == "skipped (SkipMessage)"
    assert (two.state, two.outcome, two.dead_lettered) == ("discarded", "dead_letter", True)
    assert [m.message_id for m in env.dead_letters(expect=1)] == [dropped.message_id]


def test_a_retry_age_limit_drops_is_dead_lettered_in_its_record(env: Env) -> None:
    calls: list[float] = []

    def job() -> None:
        calls.append(time.monotonic())
        raise RuntimeError("boom")

    actor = env.actor(job, max_age=300, retry_policy={
        "max_attempts": 5, "initial_interval": "PT0.6S", "backoff_strategy": "none"})
    sent = actor.send()
    env.start()
    record = env.wait_record(sent.message_id)
    assert len(calls) == 1
    assert (record.state, record.attempt, record.next_retry_at, record.dead_lettered) == (
        "discarded", 2, None, True)  # not "retryable" with a retry that never comes
    assert [e.attempt for e in record.errors] == [1]
    assert len(env.dead_letters(expect=1)) == 1


class InterruptOnce(Middleware):
    """Raises ``Shutdown`` (an interrupt, as a worker's shutdown raises it into a thread)
    once, in the hook named ``where``: deterministic stand-in for one landing there."""

    def __init__(self, where: str) -> None:
        self.where, self.fired = where, False

    def _maybe(self) -> None:
        if not self.fired:
            self.fired = True
            raise Shutdown("interrupted")

    def before_process_message(self, broker: Any, message: Any) -> None:
        if self.where == "before":
            self._maybe()

    def after_process_message(self, broker: Any, message: Any, *, result: Any = None,
                              exception: BaseException | None = None) -> None:
        if self.where == "after" and exception is None:
            self._maybe()


@pytest.mark.parametrize("where", ["before", "after"])
def test_an_interrupt_outside_the_actor_is_no_failed_attempt(env: Env, where: str) -> None:
    """Before admission (a hook ahead of OjsRetries): the delivery is given back unrun.
    After a success (a hook that runs after OjsRetries' own), Dramatiq calls every after
    hook again with the interrupt: the success stands, nothing is retried."""
    env.broker.add_middleware(InterruptOnce(where), before=Callbacks)
    calls: list[float] = []
    actor = env.actor(lambda: calls.append(time.monotonic()))
    sent = actor.send()
    env.start()
    record = env.wait_record(sent.message_id)
    time.sleep(0.3)  # a wrongly published retry would have run by now
    assert (record.state, record.attempt, record.errors) == ("completed", 1, ())
    assert len(calls) == 1
    assert env.log.retries(sent.message_id) == []


def test_a_failed_admission_gives_the_delivery_back_never_runs_it_unadmitted(
        env: Env, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Dramatiq logs a plain exception from a before hook and runs the actor anyway: ours
    turns it into a give-back, so the body only ever runs admitted (its record active)."""
    real, failed = ojs_middleware.new_record, list[bool]()

    def new_record(*args: Any) -> Any:
        if not failed:
            failed.append(True)
            raise OverflowError("an admission bug")
        return real(*args)

    monkeypatch.setattr(ojs_middleware, "new_record", new_record)
    seen: list[Any] = []

    def job() -> None:
        record = get_job_record(sent.message_id, broker=env.broker)
        seen.append(None if record is None else (record.state, record.attempt))

    sent = env.actor(job).send()
    env.start()
    record = env.wait_record(sent.message_id)
    assert seen == [("active", 1)]
    assert (record.state, record.attempt, record.errors) == ("completed", 1, ())
    assert "admission failed" in caplog.text


def test_no_time_limit_as_infinity_still_admits_a_redelivery(env: Env) -> None:
    """``time_limit=float("inf")`` is Dramatiq's "no limit"; a redelivered copy of a finished
    job (its ack lost) is still a duplicate (RabbitMQ with Results takes the waiting path)."""
    calls: list[float] = []
    actor = env.actor(lambda: calls.append(time.monotonic()), time_limit=float("inf"))
    sent = actor.send()
    env.start()
    env.wait_record(sent.message_id)
    env.broker.enqueue(sent)  # the same copy again, as after a lost ack
    time.sleep(1.0)
    assert len(calls) == 1
    record = env.record(sent.message_id)
    assert record is not None and (record.state, record.attempt) == ("completed", 1)



def test_a_stale_copy_an_age_limit_skips_leaves_the_job_s_record_alone(env: Env) -> None:
    """A copy of a finished attempt (its ack lost) skipped by ``AgeLimit`` before admission
    is not the job's end: the record stays ``completed``, no dead letter is announced."""
    calls: list[float] = []
    sent = env.actor(lambda: calls.append(time.monotonic()), max_age=400).send()
    env.start()
    assert env.wait_record(sent.message_id).state == "completed"
    time.sleep(0.6)  # the copy is older than max_age now
    env.broker.enqueue(sent)
    time.sleep(1.0)
    record = env.record(sent.message_id)
    assert record is not None
    assert (record.state, record.outcome, record.dead_lettered) == ("completed", "completed",
                                                                    False)
    assert len(calls) == 1


class Refuse(Middleware):
    """Refuses every delivery with a ``MiddlewareError`` of its own, ahead of OjsRetries."""

    def __init__(self) -> None:
        self.seen = 0

    def before_process_message(self, broker: Any, message: Any) -> None:
        if not (message.options.get("ojs") or {}).get("dead_letter"):
            self.seen += 1
            raise MiddlewareError("not now")


def test_an_error_a_middleware_raises_before_admission_is_still_a_failed_attempt(
        stub_env: Env) -> None:
    """Only an interrupt is given back unrun: a middleware's own error counts an attempt,
    as before, so the job ends by its policy instead of coming back for ever."""
    refuse = Refuse()
    stub_env.broker.add_middleware(refuse, before=Callbacks)
    sent = stub_env.actor(lambda: None, retry_policy={
        "max_attempts": 3, "initial_interval": "PT0.1S", "backoff_strategy": "none",
        "on_exhaustion": "dead_letter"}).send()
    stub_env.start()
    record = stub_env.wait_record(sent.message_id)
    assert (record.state, record.attempt, record.dead_lettered) == ("discarded", 3, True)
    assert refuse.seen == 3


def test_a_duplicate_stopped_unrun_sends_no_on_failure_a_failed_attempt_does(
        env: Env, caplog: pytest.LogCaptureFixture) -> None:
    """Dramatiq's ``Callbacks`` sends ``on_failure`` for every failed attempt; a copy of a
    finished attempt (its ack lost) that OjsRetries drops unrun is no failure, as natively
    (where it would simply run again), so no ``on_failure`` goes out for it."""
    caplog.set_level(logging.INFO)
    failures: list[str] = []

    def failed(message: dict[str, Any], error: dict[str, str]) -> None:
        failures.append(error["type"])

    handler = env.actor(failed)
    calls: list[float] = []
    job = env.actor(flaky_once(calls), on_failure=handler.actor_name,
                    retry_policy={"max_attempts": 2, "initial_interval": "PT0.1S"})
    sent = job.send()
    env.start()
    assert env.wait_record(sent.message_id).state == "completed"
    env.broker.enqueue(sent)  # the first attempt's copy again, as after a lost ack
    deadline = time.monotonic() + 20
    while "Dropping a duplicate" not in caplog.text:  # the copy was judged and stopped
        assert time.monotonic() < deadline, "the copy was never judged"
        time.sleep(0.02)
    time.sleep(1.0)  # what an on_failure for it would take to arrive
    assert len(calls) == 2
    assert failures == ["RuntimeError"]  # the failed attempt's, and none for the copy


def flaky_once(calls: list[float]) -> Any:
    def job() -> None:
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise RuntimeError("once")

    return job


def test_a_lost_attempt_carried_out_still_sends_on_failure(stub_env: Env) -> None:
    """A redelivery of an attempt whose worker died is that attempt failed (HANDLER_PANIC):
    ``Callbacks`` sends ``on_failure`` for it, as it does for every failed attempt."""
    failures: list[str] = []
    handler = stub_env.actor(lambda message, error: failures.append(error["type"]))
    actor = stub_env.actor(lambda: None, on_failure=handler.actor_name,
                           retry_policy={"max_attempts": 1})
    message = crashed_attempt(stub_env, actor)
    stub_env.start()
    stub_env.broker.enqueue(message)
    assert stub_env.wait_record(message.message_id).outcome == "discarded"
    deadline = time.monotonic() + 5
    while not failures and time.monotonic() < deadline:
        time.sleep(0.02)
    assert failures == ["AttemptConsumed"]


def test_unreadable_state_dead_lettered_unrun_still_sends_on_failure(stub_env: Env) -> None:
    """Unreadable OJS state ends the job (dead-lettered unrun, INVALID_PAYLOAD): a failure,
    so ``Callbacks`` sends ``on_failure`` for it."""
    failures: list[str] = []
    handler = stub_env.actor(lambda message, error: failures.append(error["type"]))
    calls: list[float] = []
    actor = stub_env.actor(lambda: calls.append(time.monotonic()),
                           on_failure=handler.actor_name)
    message = actor.message()
    message.options["ojs"] = {"attempt": "not a number"}
    stub_env.start()
    stub_env.broker.enqueue(message)
    deadline = time.monotonic() + 10
    while not failures and time.monotonic() < deadline:
        time.sleep(0.02)
    assert failures == ["AttemptConsumed"] and calls == []
