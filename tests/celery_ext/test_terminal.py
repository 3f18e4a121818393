"""Non-retryable errors, handler codes, dead letters and routing, on a real worker."""

from __future__ import annotations

import json

import pytest

from celery_ext import (
    DEAD_LETTER_HEADER,
    HEADER,
    JobDeadLettered,
    JobDiscarded,
    get_job_record,
)
from tests.celery_ext.conftest import Env
from tests.celery_ext.support import RUNS, drain

GET = {"timeout": 20, "interval": 0.02}


def _outcome(result: object) -> JobDiscarded:
    with pytest.raises(JobDiscarded) as info:
        result.get(**GET)  # type: ignore[attr-defined]
    return info.value


def test_ret17_exhaustion_dead_letters_the_original_message_with_history(env: Env) -> None:
    """on_exhaustion dead_letter: message, payload and history land in <queue>.dead_letter."""
    queue = env.take_queue()
    task = env.tasks["scripted"]
    result = task.apply_async((["raise:value"],), {}, queue=queue, priority=3,
                              retry_policy={"max_attempts": 2, "on_exhaustion": "dead_letter"})
    exc = _outcome(result)
    assert isinstance(exc, JobDeadLettered)
    record = exc.record
    assert (record.state, record.outcome) == ("discarded", "dead_letter")
    assert record.dead_lettered is True
    assert record.extra["dead_letter_queue"] == f"{queue}.dead_letter"

    [message] = drain(env.app, f"{queue}.dead_letter", expect=1)
    assert message.headers["id"] == result.id
    assert message.headers["task"] == task.name
    args, kwargs, _embed = message.decode()
    assert (args, kwargs) == ([["raise:value"]], {})
    assert message.properties.get("priority") == 3
    history = json.loads(message.headers[DEAD_LETTER_HEADER])
    assert [e["attempt"] for e in history["errors"]] == [1, 2]
    assert history["outcome"] == "dead_letter"
    assert message.headers["x-ojs-error-code"] == "HANDLER_ERROR"
    assert json.loads(message.headers[HEADER])["attempt"] == 2  # the delivery as it was


def test_ret07_ret18_non_retryable_exact_prefix_and_base_class(env: Env) -> None:
    """Exact type, ``prefix.*`` and a base-class name stop at attempt 1; a near miss retries."""
    queue = env.take_queue()
    task = env.tasks["scripted"]
    policy = {"max_attempts": 5, "non_retryable_errors": [
        "KeyError", "validation.*", "tests.celery_ext.support.PaymentError"]}
    exact = task.apply_async((["raise:key"],), queue=queue, retry_policy=policy)
    prefix = task.apply_async((["raise:job:validation.bad_input"],), queue=queue,
                              retry_policy=policy)
    base = task.apply_async((["raise:stolen"],), queue=queue,
                            retry_policy={**policy, "on_exhaustion": "dead_letter"})
    near_miss = task.apply_async((["raise:job:validation", "ok"],), queue=queue,
                                 retry_policy=policy)

    for result, error_type in [(exact, "KeyError"), (prefix, "validation.bad_input"),
                               (base, "tests.celery_ext.support.CardStolen")]:
        record = _outcome(result).record
        assert record.attempt == 1, error_type
        [entry] = record.errors
        assert (entry.code, entry.type) == ("NON_RETRYABLE_ERROR", error_type)
        assert [r.attempt for r in RUNS[result.id]] == [1]
    assert _outcome(base).record.dead_lettered  # non-retryable follows on_exhaustion
    assert near_miss.get(**GET) == "ok"  # "validation" does not match "validation.*"
    assert len(drain(env.app, f"{queue}.dead_letter", expect=2, timeout=1)) == 1


def test_ret08_handler_codes(env: Env) -> None:
    """RETRY follows the policy; DISCARD and FAIL end at once; DEAD_LETTER dead-letters at once."""
    queue = env.take_queue()
    task = env.tasks["scripted"]
    policy = {"max_attempts": 5, "on_exhaustion": "dead_letter"}
    retry = task.apply_async((["raise:job:ext.timeout:RETRY", "ok"],), queue=queue,
                             retry_policy=policy)
    discard = task.apply_async((["raise:job:pay.declined:DISCARD"],), queue=queue,
                               retry_policy=policy)
    fail = task.apply_async((["raise:job:pay.invalid:FAIL"],), queue=queue, retry_policy=policy)
    dead = task.apply_async((["raise:job:pay.stolen:DEAD_LETTER"],), queue=queue,
                            retry_policy={"max_attempts": 5})

    assert retry.get(**GET) == "ok"
    assert [r.attempt for r in RUNS[retry.id]] == [1, 2]
    for result, code, outcome, klass in [(discard, "DISCARD", "discarded", JobDiscarded),
                                         (fail, "FAIL", "failed", JobDiscarded),
                                         (dead, "DEAD_LETTER", "dead_letter", JobDeadLettered)]:
        exc = _outcome(result)
        assert type(exc) is klass
        assert (exc.record.attempt, exc.record.outcome) == (1, outcome)
        assert [e.handler_code for e in exc.record.errors] == [code]
        assert [r.attempt for r in RUNS[result.id]] == [1]
    [message] = drain(env.app, f"{queue}.dead_letter", expect=2, timeout=1)
    assert message.headers["id"] == dead.id  # DISCARD/FAIL never dead-letter (RET-08)


def test_retry_keeps_queue_routing_key_and_priority(env: Env) -> None:
    """A native retry goes back to the same queue and exchange with the same priority."""
    queue = env.take_queue()
    result = env.tasks["scripted"].apply_async(
        (["raise:value", "raise:value", "ok"],), queue=queue, priority=5)
    assert result.get(**GET) == "ok"
    runs = RUNS[result.id]
    assert [r.attempt for r in runs] == [1, 2, 3]
    first = runs[0].delivery_info
    for run in runs:
        assert run.delivery_info["routing_key"] == first["routing_key"] == queue
        assert run.delivery_info["exchange"] == first["exchange"]
        assert run.delivery_info["priority"] == 5


def test_ret08_self_retry_is_a_retry_failure_with_a_minimum_countdown(env: Env) -> None:
    """``self.retry(exc=, countdown=)`` on an OjsTask goes through the policy (code RETRY);
    its countdown only raises the delay (0.3 s over the policy's 0.1 s)."""
    result = env.tasks["scripted"].apply_async((["retry:0.3", "ok"],), queue=env.take_queue())
    assert result.get(**GET) == "ok"
    record = get_job_record(result.id, app=env.app)
    assert record is not None
    [entry] = record.errors
    assert (entry.handler_code, entry.type) == ("RETRY", "ValueError")
    assert record.extra["countdowns"] == [0.3]
    first, second = RUNS[result.id]
    assert second.started - first.started >= 0.3


def test_ret17_failed_dead_letter_publish_requeues_and_retries_the_publish(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first dead-letter publish fails: the message is requeued (not acked, not lost),
    its redelivery does not run the body again, and the second publish lands it."""
    import celery_ext._request as request_module

    real = request_module.publish_dead_letter
    calls: list[str] = []

    def flaky_publish(app: object, message: object, queue: str, record: object) -> None:
        calls.append(queue)
        if len(calls) == 1:
            raise ConnectionError("broker went away")
        real(app, message, queue, record)  # type: ignore[arg-type]

    monkeypatch.setattr(request_module, "publish_dead_letter", flaky_publish)
    queue = env.take_queue()
    result = env.tasks["scripted"].apply_async(
        (["raise:job:pay.stolen:DEAD_LETTER"],), queue=queue)
    [message] = drain(env.app, f"{queue}.dead_letter", expect=1, timeout=10)
    assert message.headers["id"] == result.id
    assert len(calls) == 2
    assert [r.attempt for r in RUNS[result.id]] == [1]
    assert isinstance(_outcome(result), JobDeadLettered)
