"""Issue 4 "Done when": real ``dramatiq.Worker`` on StubBroker, Redis and RabbitMQ.

Every test runs once per broker (the ``env`` fixture). Intervals are 10-200 ms and
jitter is off or fed a fixed sample, so each run is short and exact.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest
from dramatiq.common import q_name

from dramatiq_ext import OjsRetries
from dramatiq_ext.stores import MemoryRecordStore
from ojs_adapters import JobError, RetryPolicy
from tests.dramatiq_ext.harness import Env, flaky, make_env

FAST = {"initial_interval": "PT0.05S", "jitter": False}


class CardError(Exception):
    """A base class, to prove base-class matching of ``non_retryable_errors``."""


class CardStolen(CardError):
    ojs_error_type = "payment.card_stolen"


def test_ret01_retry_then_success_keeps_earlier_errors(env: Env) -> None:
    calls: list[float] = []
    actor = env.actor(flaky(2, calls), retry_policy={**FAST, "max_attempts": 3})
    env.start()
    message = actor.send()
    record = env.wait_record(message.message_id)
    assert len(calls) == 3
    assert (record.state, record.outcome, record.attempt) == ("completed", "completed", 3)
    assert [(e.attempt, e.code, e.type) for e in record.errors] == [
        (1, "HANDLER_ERROR", "RuntimeError"), (2, "HANDLER_ERROR", "RuntimeError")]
    assert record.extra["countdowns"] == [0.05, 0.1]
    assert record.dead_lettered is False


def test_ret08_exhaustion_discards_without_dead_letter(env: Env) -> None:
    calls: list[float] = []
    actor = env.actor(flaky(99, calls), retry_policy={**FAST, "max_attempts": 2})
    env.start()
    message = actor.send()
    record = env.wait_record(message.message_id)
    assert len(calls) == 2
    assert (record.state, record.outcome, record.dead_lettered) == ("discarded", "discarded", False)
    time.sleep(0.2)
    assert env.dead_letters() == []


def test_ret08_exhaustion_dead_letters_with_full_history(env: Env) -> None:
    calls: list[float] = []
    actor = env.actor(flaky(99, calls),
                      retry_policy={**FAST, "max_attempts": 3, "on_exhaustion": "dead_letter"})
    env.start()
    message = actor.send(41)
    record = env.wait_record(message.message_id)
    assert (record.state, record.outcome, record.dead_lettered) == (
        "discarded", "dead_letter", True)
    [dead] = env.dead_letters(expect=1)
    assert dead.message_id == message.message_id
    assert dead.args == (41,)  # the original payload
    assert q_name(dead.queue_name) == env.queue
    history = dead.options["ojs"]["errors"]
    assert [e["attempt"] for e in history] == [1, 2, 3]
    assert {e["code"] for e in history} == {"HANDLER_ERROR"}
    assert len(calls) == 3


@pytest.mark.parametrize("entry", ["payment.card_stolen", "payment.*", "tests.dramatiq_ext."
                                   "test_retries.CardError"])
def test_ret07_non_retryable_exact_prefix_and_base_class(env: Env, entry: str) -> None:
    calls: list[float] = []
    actor = env.actor(flaky(99, calls, CardStolen("stolen")),
                      retry_policy={**FAST, "max_attempts": 5, "non_retryable_errors": [entry]})
    env.start()
    message = actor.send()
    record = env.wait_record(message.message_id)
    assert len(calls) == 1
    assert record.outcome == "discarded"
    [error] = record.errors
    assert (error.code, error.type, error.attempt) == ("NON_RETRYABLE_ERROR",
                                                       "payment.card_stolen", 1)


@pytest.mark.parametrize(("code", "runs", "outcome", "dead"), [
    ("RETRY", 3, "discarded", False),
    ("DISCARD", 1, "discarded", False),
    ("FAIL", 1, "failed", False),
    ("DEAD_LETTER", 1, "dead_letter", True),
])
def test_ret18_handler_codes(env: Env, code: str, runs: int, outcome: str, dead: bool) -> None:
    calls: list[float] = []
    error = JobError("ext.api", "said no", code=code)  # type: ignore[arg-type]
    actor = env.actor(flaky(99, calls, error), retry_policy={**FAST, "max_attempts": 3})
    env.start()
    message = actor.send()
    record = env.wait_record(message.message_id)
    assert (len(calls), record.outcome, record.dead_lettered) == (runs, outcome, dead)
    assert record.errors[-1].handler_code == code
    letters = env.dead_letters(expect=1 if dead else 0, timeout=10 if dead else 0.3)
    assert len(letters) == (1 if dead else 0)
    if dead:
        assert letters[0].options["ojs"]["errors"][0]["handler_code"] == "DEAD_LETTER"


@pytest.mark.parametrize(("max_attempts", "runs"), [(0, 1), (1, 1), (25, 25)])
def test_ret01_max_attempts_is_exact(env: Env, max_attempts: int, runs: int) -> None:
    calls: list[float] = []
    policy = {"max_attempts": max_attempts, "initial_interval": "PT0.01S",
              "backoff_strategy": "none", "jitter": False}
    actor = env.actor(flaky(99, calls), retry_policy=policy)
    env.start()
    message = actor.send()
    record = env.wait_record(message.message_id, timeout=40)
    assert len(calls) == runs
    assert record.attempt == runs
    assert record.outcome == "discarded"


def test_ret15_twelve_failures_keep_the_newest_ten(env: Env) -> None:
    calls: list[float] = []
    policy = {"max_attempts": 12, "initial_interval": "PT0.01S", "backoff_strategy": "none",
              "jitter": False, "on_exhaustion": "dead_letter"}
    actor = env.actor(flaky(99, calls), retry_policy=policy)
    env.start()
    message = actor.send()
    record = env.wait_record(message.message_id, timeout=30)
    assert len(calls) == 12
    assert [e.attempt for e in record.errors] == list(range(3, 13))
    [dead] = env.dead_letters(expect=1)
    assert [e["attempt"] for e in dead.options["ojs"]["errors"]] == list(range(3, 13))


def test_ret10_per_message_policy_overrides_the_actor(env: Env) -> None:
    calls: list[float] = []
    actor = env.actor(flaky(99, calls), retry_policy={**FAST, "max_attempts": 5})
    env.start()
    message = actor.send_with_options(retry_policy={"max_attempts": 2})
    record = env.wait_record(message.message_id)
    assert len(calls) == 2
    assert record.max_attempts == 2
    assert record.extra["countdowns"] == [0.05]  # the actor's interval still applies (merge)


def test_retry_keeps_queue_priority_and_options(env: Env) -> None:
    calls: list[float] = []
    actor = env.actor(flaky(1, calls), priority=5, retry_policy={**FAST, "max_attempts": 2})
    env.start()
    message = actor.send_with_options(args=(1, "a"), broker_priority=3)
    record = env.wait_record(message.message_id)
    assert record.state == "completed"
    [(retried, delay)] = env.log.retries(message.message_id)
    assert delay == 50
    assert q_name(retried.queue_name) == env.queue
    assert retried.actor_name == actor.actor_name
    assert env.broker.get_actor(retried.actor_name).priority == 5
    assert retried.options["broker_priority"] == 3
    assert retried.args == (1, "a")
    assert retried.options["ojs"]["attempt"] == 2


def test_ret11_delay_handed_to_broker_is_the_policy_delay(env: Env) -> None:
    """A seeded jitter sample: the broker gets policy.delay(n, u) in ms; no retry is early."""
    policy = {"max_attempts": 4, "initial_interval": "PT0.1S", "max_interval": "PT0.3S",
              "jitter": True}
    samples = iter([0.1, 0.9, 0.4])  # multipliers 0.6, 1.4, 0.9
    env.ojs.jitter_source = lambda: next(samples)
    calls: list[float] = []
    actor = env.actor(flaky(3, calls), retry_policy=policy)
    env.start()
    message = actor.send()
    record = env.wait_record(message.message_id)
    expected = [RetryPolicy.from_dict(policy).delay(n, jitter_sample=u)
                for n, u in ((1, 0.1), (2, 0.9), (3, 0.4))]
    # 0.1 * 0.6; 0.2 * 1.4; 0.4 capped to 0.3 before jitter, * 0.9
    assert expected == pytest.approx([0.06, 0.28, 0.27])
    handed = [delay for _m, delay in env.log.retries(message.message_id)]
    assert handed == [60, 280, 270]
    assert record.extra["countdowns"] == pytest.approx(expected)
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    assert all(gap >= s for gap, s in zip(gaps, expected, strict=True)), (gaps, expected)


def test_time_limit_becomes_handler_timeout_and_consumes_an_attempt(env: Env) -> None:
    calls: list[float] = []

    def slow() -> None:
        calls.append(time.monotonic())
        if len(calls) == 1:
            for _ in range(300):  # Python-level work, so the async exception lands
                time.sleep(0.01)

    actor = env.actor(slow, time_limit=150, retry_policy={**FAST, "max_attempts": 2})
    env.start()
    message = actor.send()
    record = env.wait_record(message.message_id)
    assert (record.state, record.attempt, len(calls)) == ("completed", 2, 2)
    [error] = record.errors
    assert (error.code, error.attempt) == ("HANDLER_TIMEOUT", 1)
    assert error.type.endswith("TimeLimitExceeded")


class _SlowEndStore(MemoryRecordStore):
    """A store whose save of a ``completed`` record takes a while (a slow backend)."""

    def save(self, message_id: str, record: dict[str, Any]) -> None:
        if record.get("state") == "completed":
            time.sleep(0.25)
        super().save(message_id, record)


def test_a_job_that_ended_in_time_is_not_timed_out_by_its_bookkeeping() -> None:
    """The actor returns inside its limit; saving its outcome outlasts the limit. The limit
    is the actor's: the job is done once, with no HANDLER_TIMEOUT (RET-12 is for stalls)."""
    calls: list[float] = []

    def quick() -> None:
        calls.append(time.monotonic())
        for _ in range(15):  # 150 ms of a 300 ms limit, in Python (an interrupt would land)
            time.sleep(0.01)

    with make_env("stub", ojs=OjsRetries(store=_SlowEndStore())) as env:
        actor = env.actor(quick, time_limit=300, retry_policy={**FAST, "max_attempts": 3})
        env.start(threads=1)
        message = actor.send()
        record = env.wait_record(message.message_id)
        time.sleep(0.5)  # a wrongly timed-out attempt would have run again by now
        assert (record.state, record.attempt, record.errors) == ("completed", 1, ())
        assert len(calls) == 1


def test_record_is_readable_during_the_job(env: Env) -> None:
    seen: list[tuple[str, int]] = []

    def job() -> None:
        record = env.record(current["id"])
        assert record is not None
        seen.append((record.state, record.attempt))
        if len(seen) == 1:
            raise RuntimeError("once")

    current: dict[str, str] = {}
    actor = env.actor(job, retry_policy={**FAST, "max_attempts": 2})
    message = actor.message()
    current["id"] = message.message_id
    env.start()
    env.broker.enqueue(message)
    record = env.wait_record(message.message_id)
    assert seen == [("active", 1), ("active", 2)]
    assert record.state == "completed"


def test_ret08_handler_retry_records_its_cause_with_code_retry(env: Env) -> None:
    """``raise Retry(delay=...)`` from an ``except`` block is recorded as Celery records
    ``self.retry(exc=..., countdown=...)``: the type of the error it handled, handler code
    RETRY, and its delay as a floor on the countdown (``ojs_adapters.requested_retry``)."""
    from dramatiq.errors import Retry

    calls: list[float] = []

    def job() -> str:
        calls.append(time.monotonic())
        if len(calls) == 1:
            try:
                raise ValueError("asked to retry")
            except ValueError as error:
                raise Retry(delay=300) from error
        if len(calls) == 2:
            raise Retry(delay=50)  # no error at hand: as Celery's bare self.retry()
        return "ok"

    actor = env.actor(job, retry_policy={**FAST, "max_attempts": 3})
    env.start()
    message = actor.send()
    record = env.wait_record(message.message_id)
    assert record.state == "completed"
    assert [(e.type, e.handler_code, e.message) for e in record.errors] == [
        ("ValueError", "RETRY", "asked to retry"),
        ("ojs.retry_requested", "RETRY", "retry requested by the handler")]
    assert record.extra["countdowns"][0] == 0.3  # the handler's 300 ms over the policy's 50
    assert calls[1] - calls[0] >= 0.3


@pytest.mark.parametrize(("options", "ended"), [
    ({"throws": (RuntimeError,), "min_backoff": 50}, ("completed", 3, "HANDLER_ERROR")),
    ({"retry_policy": {**FAST, "non_retryable_errors": ["RuntimeError", "dramatiq.*"]}},
     ("discarded", 2, "NON_RETRYABLE_ERROR")),
], ids=["throws", "non_retryable_errors"])
def test_ret08_a_handler_retry_is_matched_as_celery_s_except_by_throws(
        env: Env, options: dict[str, Any], ended: tuple[str, int, str]) -> None:
    """``raise Retry(delay=...)`` asks for a retry (handler code RETRY). Natively Dramatiq
    retries it whatever ``throws`` lists (unless Retry is an instance of one of them,
    test_native_schedule), even raised from a ``throws`` error; an OJS policy's own
    ``non_retryable_errors`` still stops it (section 7.2 step 3), as ``self.retry(exc=)``
    on Celery. A bare ``Retry`` names no error type to match. Its delay is a floor."""
    from dramatiq.errors import Retry

    calls: list[float] = []

    def job() -> str:
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise Retry(delay=300)
        if len(calls) == 2:
            try:
                raise RuntimeError("stale")
            except RuntimeError as error:
                raise Retry(delay=10) from error
        return "ok"

    actor = env.actor(job, **options)
    env.start()
    message = actor.send()
    record = env.wait_record(message.message_id)
    state, runs, code = ended
    assert (record.state, len(calls)) == (state, runs)
    assert [(e.type, e.code, e.handler_code) for e in record.errors] == [
        ("ojs.retry_requested", "HANDLER_ERROR", "RETRY"), ("RuntimeError", code, "RETRY")]
    assert record.extra["countdowns"][0] >= 0.3
    assert calls[1] - calls[0] >= 0.3


def test_a_retry_carries_its_record_so_admission_writes_it_active(env: Env) -> None:
    """The retry's ``options["ojs"]`` carries ``countdowns`` and ``delays_ms``: with them the
    admission script writes attempt 2's whole ``active`` record (docs/cost.md), and the
    final record is the same as when it was read and saved in two more round trips."""
    calls: list[float] = []
    actor = env.actor(flaky(1, calls), retry_policy={**FAST, "max_attempts": 3})
    env.start()
    message = actor.send()
    record = env.wait_record(message.message_id)
    [(retry, delay)] = env.log.retries(message.message_id)
    carried = retry.options["ojs"]
    assert (carried["countdowns"], carried["delays_ms"], delay) == ([0.05], [50], 50)
    assert (record.state, record.attempt, record.extra["countdowns"],
            record.extra["delays_ms"]) == ("completed", 2, [0.05], [50])
    assert [e.attempt for e in record.errors] == [1]
