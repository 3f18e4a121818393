"""Retry, exhaustion and history on a real worker, on memory://, Redis and RabbitMQ."""

from __future__ import annotations

import time

import pytest

from celery_ext import JobDiscarded, get_job_record
from ojs_adapters import JobRecord, RetryPolicy
from tests.celery_ext.conftest import Env
from tests.celery_ext.support import (
    APP_DEFAULT_POLICY,
    JITTER_SEED,
    RUNS,
    TIMED_POLICY,
    drain,
    wait_for,
)

GET = {"timeout": 20, "interval": 0.02}


def test_ret11_retry_then_success_exact_countdowns_and_gaps(env: Env) -> None:
    """Two failures then success: countdowns are policy.delay(n, u) for the seeded u,
    each retry starts no earlier than its countdown (RET-11), errors are kept."""
    import random

    result = env.tasks["timed"].apply_async((2,), queue=env.take_queue())
    assert result.get(**GET) == "ok"

    record = get_job_record(result.id, app=env.app)
    assert record is not None
    assert (record.state, record.outcome, record.attempt) == ("completed", "completed", 3)
    assert [(e.attempt, e.code, e.type) for e in record.errors] == [
        (1, "HANDLER_ERROR", "ValueError"), (2, "HANDLER_ERROR", "ValueError")]

    policy = RetryPolicy.from_dict(TIMED_POLICY, base=RetryPolicy.from_dict(APP_DEFAULT_POLICY))
    rng = random.Random(JITTER_SEED)
    samples = [rng.random(), rng.random()]
    assert record.extra["jitter_samples"] == samples
    expected = [policy.delay(n, jitter_sample=u) for n, u in enumerate(samples, start=1)]
    assert record.extra["countdowns"] == expected  # exact floats

    runs = RUNS[result.id]
    assert [r.attempt for r in runs] == [1, 2, 3]
    for earlier, later, countdown in zip(runs, runs[1:], expected, strict=False):
        assert later.started - earlier.started >= countdown
        assert later.eta is not None


def test_ret17_exhaustion_discards_and_get_raises_with_record(env: Env) -> None:
    """max_attempts 3, always failing: discarded after 3 attempts; get() raises promptly."""
    result = env.tasks["scripted"].apply_async((["raise:value"],), queue=env.take_queue())
    started = time.monotonic()
    with pytest.raises(JobDiscarded) as info:
        result.get(**GET)
    assert time.monotonic() - started < 15
    record = info.value.record
    assert (record.state, record.outcome, record.attempt) == ("discarded", "discarded", 3)
    assert record.dead_lettered is False
    assert [e.attempt for e in record.errors] == [1, 2, 3]
    assert get_job_record(result.id, app=env.app) == record
    assert [r.attempt for r in RUNS[result.id]] == [1, 2, 3]


@pytest.mark.parametrize("max_attempts, runs", [(0, 1), (1, 1), (25, 25)])
def test_ret01_max_attempts_is_an_exact_bound(env: Env, max_attempts: int, runs: int) -> None:
    """0 and 1 run once; 25 runs exactly 25 times (tiny constant intervals)."""
    policy = {"max_attempts": max_attempts, "initial_interval": "PT0.01S",
              "max_interval": "PT0.01S"}
    result = env.tasks["scripted"].apply_async(
        (["raise:value"],), queue=env.take_queue(), retry_policy=policy)
    with pytest.raises(JobDiscarded) as info:
        result.get(**GET)
    assert info.value.record.attempt == runs
    assert [r.attempt for r in RUNS[result.id]] == list(range(1, runs + 1))
    assert len(info.value.record.extra["countdowns"]) == runs - 1


def test_ret15_twelve_failures_keep_the_newest_ten(env: Env) -> None:
    """History of 12 failures: at least the 10 newest entries survive, newest last."""
    policy = {"max_attempts": 12, "initial_interval": "PT0.01S", "max_interval": "PT0.01S"}
    result = env.tasks["scripted"].apply_async(
        (["raise:value"],), queue=env.take_queue(), retry_policy=policy)
    with pytest.raises(JobDiscarded) as info:
        result.get(**GET)
    attempts = [e.attempt for e in info.value.record.errors]
    assert len(attempts) >= 10
    assert attempts == list(range(13 - len(attempts), 13))
    for entry in info.value.record.errors:  # ERR-012
        assert entry.code and entry.message and entry.occurred_at and entry.attempt


def test_ret10_per_call_override_merges_over_task_and_app_policies(env: Env) -> None:
    """A per-call policy rides in the headers and merges over task and app layers."""
    result = env.tasks["scripted"].apply_async(
        (["raise:value", "ok"],), queue=env.take_queue(),
        retry_policy={"max_attempts": 5, "on_exhaustion": "dead_letter"})
    assert result.get(**GET) == "ok"
    effective = get_job_record(result.id, app=env.app).extra["retry_policy"]  # type: ignore[union-attr]
    assert effective["max_attempts"] == 5
    assert effective["on_exhaustion"] == "dead_letter"
    assert effective["initial_interval"] == "PT0.1S"  # from the task
    assert effective["max_interval"] == "PT2S"  # from the app default
    assert effective["jitter"] is False


def test_ret14_record_is_readable_while_the_retry_waits(env: Env) -> None:
    """While a retry waits: state retryable, next_retry_at set, attempt = the failed one."""
    result = env.tasks["scripted"].apply_async(
        (["raise:value", "ok"],), queue=env.take_queue(),
        retry_policy={"initial_interval": "PT1.5S", "max_interval": "PT2S"})
    def waiting() -> JobRecord | None:
        record = get_job_record(result.id, app=env.app)
        return record if record is not None and record.state == "retryable" else None

    seen = wait_for(waiting, timeout=10)
    assert seen.attempt == 1 and seen.next_retry_at is not None
    assert seen.next_retry_at > seen.errors[-1].occurred_at
    # Celery's own meta says RETRY too (written just after the record).
    wait_for(lambda: result.state == "RETRY", timeout=1)
    assert result.get(**GET) == "ok"
    final = get_job_record(result.id, app=env.app)
    assert final is not None and final.state == "completed"
    assert [e.attempt for e in final.errors] == [1]  # a success keeps earlier errors


def test_max_duration_extension_counts_from_the_first_attempt(env: Env) -> None:
    """Opt-in ``max_duration`` (core extension): the first attempt's start time rides in the
    header, so a retry that would start past the window exhausts the job instead."""
    policy = {"max_attempts": 25, "initial_interval": "PT0.3S", "max_interval": "PT0.3S",
              "max_duration": "PT0.5S"}
    result = env.tasks["scripted"].apply_async(
        (["raise:value"],), queue=env.take_queue(), retry_policy=policy)
    with pytest.raises(JobDiscarded) as info:
        result.get(**GET)
    assert info.value.record.attempt == 2  # retry 1 at 0.3 s fits, retry 2 at 0.6 s does not
    assert [r.attempt for r in RUNS[result.id]] == [1, 2]


def test_a_task_that_calls_itself_runs_once_as_a_plain_call(env: Env) -> None:
    """A recursive task calls itself from its body: Celery makes that a plain function
    call, and so does OjsTask (not a second delivery of the same attempt, which would wait
    for the attempt's own lease and be requeued for ever)."""
    result = env.tasks["scripted"].apply_async((["recurse:3"],), queue=env.take_queue())
    assert result.get(**GET) == "ok"
    # The delivery and its three nested calls, once each (a nested call carries a copy of
    # its caller's request, as Celery makes it), and no second delivery.
    assert len(RUNS[result.id]) == 4
    record = get_job_record(result.id, app=env.app)
    assert record is not None and (record.state, record.attempt) == ("completed", 1)


@pytest.mark.parametrize("script", [
    ["replace:ok"],
    ["raise:value", "replace:ok"],
    ["raise:value", "replace:raise:value|ok"],
    ["raise:value", "replace-chain:ok"],
], ids=["first-attempt", "second-attempt", "replacement-retries", "chain"])
def test_a_replaced_task_runs_its_replacement(env: Env, script: list[str]) -> None:
    """``Task.replace`` sends a new task with the same id (Celery stamps it with
    ``replaced_task_nesting``): its attempts are a new round, never taken for duplicates
    of the attempts of the task it replaced, whichever attempt that was on."""
    result = env.tasks["scripted"].apply_async((script,), queue=env.take_queue(),
                                               idempotency_key="order-7")
    assert result.get(**GET) == "ok"
    replaced = len(script)  # the replacing run is the script's last attempt
    tail = 2 if script[-1].endswith("|ok") else 1
    assert [r.attempt for r in RUNS[result.id]] == [*range(1, replaced + 1),
                                                    *range(1, tail + 1)]
    record = get_job_record(result.id, app=env.app)
    assert record is not None
    assert (record.state, record.attempt) == ("completed", tail)
    assert record.extra["replaced_task_nesting"] == 1
    # The job's history and key go on in the replacement (its attempts count afresh).
    assert [e.attempt for e in record.errors] == [*range(1, replaced), *range(1, tail)]
    assert record.extra["idempotency_key"] == "order-7"


@pytest.mark.parametrize("step", ["ignore", "reject"])
def test_a_job_its_handler_ends_is_discarded_saying_so(env: Env, step: str) -> None:
    """``Ignore`` and ``Reject(requeue=False)`` end the job the Celery way (the message is
    acked or dropped, no retry): the record says so instead of keeping the earlier
    attempt's ``retryable``, which no retry will ever follow."""
    result = env.tasks["scripted"].apply_async((["raise:value", step],),
                                               queue=env.take_queue())
    ended = wait_for(lambda: _state(env, result.id) == "discarded", timeout=20)
    assert ended is not None
    record = get_job_record(result.id, app=env.app)
    assert record is not None
    assert (record.state, record.outcome, record.attempt) == ("discarded", "discarded", 2)
    assert record.extra["end_reason"] == (
        f"ended by the handler ({'Ignore' if step == 'ignore' else 'Reject'})")
    assert [e.attempt for e in record.errors] == [1]
    assert [r.attempt for r in RUNS[result.id]] == [1, 2]


def _state(env: Env, job_id: str) -> str | None:
    record = get_job_record(job_id, app=env.app)
    return None if record is None else record.state


def test_a_task_inside_a_chain_replaced_on_attempt_two(env: Env) -> None:
    """Replaced inside a chain, the task's replacement is followed by the rest of the chain
    (Celery's rule): the replacement takes the job's id and its history, then the chain
    goes on."""
    from celery import chain

    queue = env.take_queue()
    first = env.tasks["scripted"].si(["raise:value", "replace:ok"]).set(
        queue=queue, idempotency_key="order-8")
    result = chain(first, env.tasks["scripted"].si(["ok"]).set(queue=queue)).apply_async()
    assert result.get(**GET) == "ok"
    job = result.parent.id
    assert [r.attempt for r in RUNS[job]] == [1, 2, 1]
    record = get_job_record(job, app=env.app)
    assert record is not None
    assert (record.state, record.attempt, record.extra["replaced_task_nesting"]) == (
        "completed", 1, 1)
    assert [e.attempt for e in record.errors] == [1]
    assert record.extra["idempotency_key"] == "order-8"


def test_a_replacement_that_cannot_be_sent_fails_the_attempt(env: Env) -> None:
    """The record was reset for the replacement's round before Celery sent it; the send
    failed (here: arguments JSON cannot encode), so the reset is undone and the attempt
    fails through the policy, retried as any failure, never dropped as a duplicate of a
    round that never began."""
    result = env.tasks["scripted"].apply_async((["replace-unsendable:x"],),
                                               queue=env.take_queue())
    with pytest.raises(JobDiscarded) as ended:
        result.get(**GET)
    record = ended.value.record
    assert (record.state, record.attempt) == ("discarded", 3)
    assert [e.attempt for e in record.errors] == [1, 2, 3]
    assert "replaced_task_nesting" not in record.extra
    assert [r.attempt for r in RUNS[result.id]] == [1, 2, 3]


def test_a_failure_after_a_replace_leaves_the_job_to_its_replacement(env: Env) -> None:
    """The body swallows the ``Ignore`` of ``self.replace`` and then raises, on its last
    attempt: the job went on as the replacement, so no decision is taken on the replaced
    task (no dead letter, no event); the record is the replacement's."""
    queue = env.take_queue()
    result = env.tasks["scripted"].apply_async(
        (["replace-swallowed:ok"],), queue=queue,
        retry_policy={"max_attempts": 1, "on_exhaustion": "dead_letter"})

    def replaced_and_done() -> JobRecord | None:
        record = get_job_record(result.id, app=env.app)
        return record if record is not None and record.state == "completed" else None

    record = wait_for(replaced_and_done, timeout=20)
    assert (record.attempt, record.extra["replaced_task_nesting"]) == (1, 1)
    assert drain(env.app, f"{queue}.dead_letter", timeout=1.0) == []
    assert [r.attempt for r in RUNS[result.id]] == [1, 1]
