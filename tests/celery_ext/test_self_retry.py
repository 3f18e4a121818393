"""Celery's ``self.retry(...)`` in an ``OjsTask`` on a real worker: what each argument means.

The policy owns the schedule, but a call keeps its Celery meaning where the policy allows
(RET-08: a handler's retry request is a RETRY failure, the policy's backoff a floor under
its countdown), and raises ``RetryRefused`` where it cannot, the job kept.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

import pytest
from celery import signals
from kombu.exceptions import OperationalError

import celery_ext._retry_send as retry_send_module  # where a retry is published
from celery_ext import JobDeadLettered, JobDiscarded, RetryRefused, get_job_record
from celery_ext._handoff import backend_retry_of
from celery_ext.records import RecordStore
from ojs_adapters import JobRecord
from ojs_adapters.history import ErrorEntry
from ojs_adapters.runtime.handoff import HANDED_OFF
from tests.celery_ext.conftest import Env
from tests.celery_ext.retry_steps import CALLS, HOOKED
from tests.celery_ext.support import drain, wait_for

GET = {"timeout": 20, "interval": 0.02}


def _record(env: Env, task_id: str) -> JobRecord:
    record = get_job_record(task_id, app=env.app)
    assert record is not None
    return record


def test_ret08_bare_self_retry_records_a_request_and_no_made_up_type(env: Env) -> None:
    """``raise self.retry()`` with no exception: the entry says the handler asked (RETRY,
    ``ojs.retry_requested``), not a ``RuntimeError`` nobody raised."""
    result = env.tasks["retrying"].apply_async(("bare",), queue=env.take_queue())
    assert result.get(**GET) == "ok"
    [entry] = _record(env, result.id).errors
    assert (entry.type, entry.handler_code, entry.code) == (
        "ojs.retry_requested", "RETRY", "HANDLER_ERROR")


@pytest.mark.parametrize(("step", "said"), [("args", "n=10"), ("kwargs", "n=20")])
def test_self_retry_args_and_kwargs_are_what_the_next_attempt_runs_with(
        env: Env, step: str, said: str) -> None:
    result = env.tasks["retrying"].apply_async((step, 0), queue=env.take_queue())
    assert result.get(**GET) == said
    assert [attempt for attempt, _ in CALLS[result.id]] == [1, 2]


def test_new_arguments_leave_the_record_once_the_retry_is_handed_off(env: Env) -> None:
    """The record keeps ``self.retry(args=...)`` only while the retry may have to be sent
    again from it: not once it is on the broker (the record is readable by operators)."""
    result = env.tasks["retrying"].apply_async(("args-later", 0), queue=env.take_queue())
    waiting = wait_for(lambda: (r := get_job_record(result.id, app=env.app)) is not None
                       and r.extra.get(HANDED_OFF) is not None and r)
    assert (waiting.state, waiting.attempt) == ("retryable", 1)
    assert "next_call" not in waiting.extra
    assert result.get(**GET) == "n=10"


def test_ret07_a_job_ended_by_the_policy_keeps_no_next_arguments(env: Env) -> None:
    """``self.retry(exc=ValueError, args=...)`` with ValueError non-retryable: discarded, and
    the final record holds no arguments."""
    result = env.tasks["retrying"].apply_async(
        ("args-refused-by-policy", 0), queue=env.take_queue(),
        retry_policy={"non_retryable_errors": ["ValueError"]})
    with pytest.raises(JobDiscarded) as info:
        result.get(**GET)
    assert info.value.record.outcome == "discarded"
    assert "next_call" not in info.value.record.extra
    assert "next_call" not in _record(env, result.id).extra


def test_ret08_eta_is_the_least_delay_before_the_next_attempt(env: Env) -> None:
    """``eta`` 0.4 s ahead: the countdown recorded is that wait (over the policy's 0.1 s),
    and the next attempt does not start before it (RET-11)."""
    sent = time.time()
    result = env.tasks["retrying"].apply_async(("eta",), queue=env.take_queue())
    assert result.get(**GET) == "ok"
    [countdown] = _record(env, result.id).extra["countdowns"]
    assert 0.25 < countdown <= 0.4
    assert time.time() - sent >= 0.4


def test_ret08_a_zero_countdown_gives_way_to_an_eta_as_in_celery(env: Env) -> None:
    """``self.retry(countdown=0, eta=<0.4 s ahead>)``: Celery converts a countdown to an ETA
    only when it is not 0, so the eta stands; the next attempt waits for it (RET-11)."""
    sent = time.time()
    result = env.tasks["retrying"].apply_async(("eta-countdown-0",), queue=env.take_queue())
    assert result.get(**GET) == "ok"
    [countdown] = _record(env, result.id).extra["countdowns"]
    assert 0.25 < countdown <= 0.4
    assert time.time() - sent >= 0.4


def test_ret01_max_retries_is_this_call_s_budget_and_reraises_exc_when_spent(env: Env) -> None:
    """``self.retry(exc=..., max_retries=1)`` under a 3-attempt policy: two runs, as in
    Celery; the second re-raises ``exc`` in the body and the job ends per the policy."""
    result = env.tasks["retrying"].apply_async(("max-retries",), queue=env.take_queue())
    with pytest.raises(JobDiscarded) as info:
        result.get(**GET)
    record = info.value.record
    assert (record.attempt, record.max_attempts, record.outcome) == (2, 2, "discarded")
    assert [(e.type, e.message) for e in record.errors] == [
        ("ValueError", "attempt 1"), ("ValueError", "attempt 2")]
    assert [attempt for attempt, _ in CALLS[result.id]] == [1, 2]


def test_a_spent_budget_raises_max_retries_exceeded_in_the_body(env: Env) -> None:
    """Celery's documented fallback (``except MaxRetriesExceededError``) still runs."""
    result = env.tasks["retrying"].apply_async(("catch-max",), queue=env.take_queue())
    assert result.get(**GET) == "gave up at 2"


def test_an_option_the_policy_cannot_honour_is_refused_and_the_job_kept(env: Env) -> None:
    """``self.retry(queue=...)``: ``RetryRefused`` naming the field; the job is
    dead-lettered (a person looks at it), not dropped, whatever ``on_exhaustion`` says."""
    queue = env.take_queue()
    result = env.tasks["retrying"].apply_async(("refused",), queue=queue)
    with pytest.raises(JobDeadLettered) as info:
        result.get(**GET)
    [entry] = info.value.record.errors
    assert (entry.type, entry.handler_code, entry.code) == (
        "celery_ext.exceptions.RetryRefused", "DEAD_LETTER", "INVALID_ARGS")
    assert "'queue'" in entry.message
    [letter] = drain(env.app, f"{queue}.dead_letter", expect=1, timeout=10)
    assert letter.headers["id"] == result.id


@pytest.mark.parametrize(("kind", "seen"), [("ValueError", (ValueError, "boom")),
                                            ("ojs.retry_requested", (type(None), "None"))])
def test_a_resent_retry_carries_the_real_failure_and_the_new_arguments(
        env: Env, kind: str, seen: tuple[type, str]) -> None:
    """The record says attempt 1 failed with ValueError and its retry (new args) was not
    handed off: the redelivered original sends it again. Celery's RETRY state and
    ``task_retry`` get a ValueError (not a WorkerLostError; ``None`` after a bare
    ``self.retry()``, as in Celery), and attempt 2 runs with the arguments
    ``self.retry(args=...)`` gave."""
    queue, task = env.take_queue(), env.tasks["retrying"]
    task_id = str(uuid.uuid4())
    entry = ErrorEntry(1, "HANDLER_ERROR", kind, "boom", "2026-11-27T00:00:00Z")
    decided = JobRecord(id=task_id, type=task.name, queue=queue, max_attempts=3, extra={
        "countdowns": [0.05], "jitter_samples": [None],
        "next_call": {"args": ["args", 5], "kwargs": None}}).started(1)
    RecordStore(env.app.backend).save(decided.failed(entry, action="retry", delay=0.05))
    reasons: list[BaseException] = []

    def note(sender: Any = None, request: Any = None, reason: Any = None, **_: Any) -> None:
        if getattr(request, "id", None) == task_id:
            reasons.append(reason)

    signals.task_retry.connect(note, weak=False)
    try:
        said = task.apply_async(("args", 0), task_id=task_id, queue=queue).get(**GET)
        wait_for(lambda: reasons)  # attempt 2 may end before the resend's thread reports
    finally:
        signals.task_retry.disconnect(note)
    assert [(type(r.exc), str(r.exc)) for r in reasons] == [seen]  # Retry.exc
    assert (said, CALLS[task_id]) == ("n=5", [(2, 5)])  # attempt 1 is not run again


def test_the_last_failure_is_logged_at_error_with_its_traceback(
        env: Env, caplog: pytest.LogCaptureFixture) -> None:
    """As Celery logs a failed task: ERROR, with the body's own traceback (not INFO
    "raised expected" without one)."""
    result = env.tasks["scripted"].apply_async(
        (["raise:value"],), queue=env.take_queue(), retry_policy={"max_attempts": 1})
    with caplog.at_level(logging.INFO, logger="celery.app.trace"):
        with pytest.raises(JobDiscarded):
            result.get(**GET)
        time.sleep(0.2)  # the log line comes after the stored result
    [logged] = [r for r in caplog.records if r.name == "celery.app.trace"
                and result.id in r.getMessage() and "raised" in r.getMessage()]
    assert logged.levelno == logging.ERROR
    assert logged.exc_info is not None
    text = logging.Formatter().formatException(logged.exc_info)
    assert 'raise _failure(step.split(":", 1)[1])' in text  # the body's frame
    assert "ValueError: boom" in text


def test_max_retries_exceeded_names_the_next_call_s_arguments_as_celery_does(env: Env) -> None:
    """``self.retry(args=..., max_retries=0)``: Celery builds the next call before it finds
    the budget spent, so its ``MaxRetriesExceededError`` names those arguments, not the
    running call's."""
    result = env.tasks["retrying"].apply_async(("spent-args", 0), queue=env.take_queue())
    name = env.tasks["retrying"].name
    assert result.get(**GET) == (f"Can't retry {name}[{result.id}] args:('spent-args', 1) "
                                 f"kwargs:{{}}|('spent-args', 1)|{{}}")


def test_ret08_exc_given_as_a_message_string_retries_as_in_celery(env: Env) -> None:
    """Celery's ``Retry`` takes ``exc="..."`` as its text and retries: so does the policy,
    the entry a handler's request (``ojs.retry_requested``) carrying that text, and the
    ``Retry`` Celery logs and hands to ``task_retry`` says it (its ``exc`` ``None``)."""
    task_id = str(uuid.uuid4())
    reasons: list[Any] = []

    def note(sender: Any = None, request: Any = None, reason: Any = None, **_: Any) -> None:
        if getattr(request, "id", None) == task_id:
            reasons.append(reason)

    signals.task_retry.connect(note, weak=False)
    try:
        result = env.tasks["retrying"].apply_async(("exc-message",), task_id=task_id,
                                                   queue=env.take_queue())
        assert result.get(**GET) == "ok"
        wait_for(lambda: reasons)
    finally:
        signals.task_retry.disconnect(note)
    [reason] = reasons
    assert (reason.exc, str(reason).split(": ", 1)[1]) == (None, "the cache is cold")
    [entry] = _record(env, result.id).errors
    assert (entry.type, entry.message, entry.handler_code) == (
        "ojs.retry_requested", "the cache is cold", "RETRY")


def test_exc_that_is_no_exception_is_refused_and_the_job_kept(env: Env) -> None:
    """``self.retry(exc=5)``: Celery stores 5 as the RETRY result and every later read of
    the task's state fails; here ``RetryRefused`` names ``exc`` and the job is
    dead-lettered, not lost."""
    queue = env.take_queue()
    result = env.tasks["retrying"].apply_async(("exc-number",), queue=queue)
    with pytest.raises(JobDeadLettered) as info:
        result.get(**GET)
    [entry] = info.value.record.errors
    assert (entry.type, entry.handler_code, entry.code) == (
        "celery_ext.exceptions.RetryRefused", "DEAD_LETTER", "INVALID_ARGS")
    assert "exc=" in entry.message and "int" in entry.message
    [letter] = drain(env.app, f"{queue}.dead_letter", expect=1, timeout=10)
    assert letter.headers["id"] == result.id


def test_a_retry_whose_publish_failed_is_resent_with_the_new_arguments(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """``self.retry(args=...)``, and the broker refuses the retry on every try in place: the
    original is requeued with the new arguments still in the record, its redelivery sends
    the retry again from it, and attempt 2 runs with them (the call Celery meant to send);
    once handed off, the record holds them no more."""
    queue, task = env.take_queue(), env.tasks["retrying"]
    task_id = str(uuid.uuid4())
    cuts = backend_retry_of(env.app).tries  # every try of the first hand-off fails
    seen: list[dict[str, Any]] = []
    real_retry = retry_send_module.Task.retry

    class _Task:  # Task.retry, its publish cut for this job's first hand-off
        @staticmethod
        def retry(sender: Any, *call: Any, **options: Any) -> Any:
            nonlocal cuts
            if sender.request.id == task_id:
                if cuts > 0:
                    cuts -= 1
                    raise OperationalError("link cut")
                if not seen:  # the resend: what the record held since the failed hand-off
                    seen.append(dict(_record(env, task_id).extra))
            return real_retry(sender, *call, **options)

    monkeypatch.setattr(retry_send_module, "Task", _Task)
    said = task.apply_async(("args", 0), task_id=task_id, queue=queue).get(**GET)
    assert cuts == 0
    assert seen[0]["next_call"] == {"args": ["args", 10], "kwargs": None}
    assert (said, CALLS[task_id]) == ("n=10", [(1, 0), (2, 10)])
    record = _record(env, task_id)
    assert (record.state, record.attempt) == ("completed", 2)
    assert "next_call" not in record.extra


def test_self_retry_from_after_return_is_refused_and_the_job_stays_completed(env: Env) -> None:
    """``after_return`` runs once the attempt is over and its outcome stored: its
    ``self.retry()`` raises ``RetryRefused`` (Celery logs it), the job stays completed and
    runs once; before, an internal request of the adapter escaped and was dropped."""
    result = env.tasks["hooked"].apply_async(("after_return",), queue=env.take_queue())
    assert result.get(**GET) == "ok"
    wait_for(lambda: HOOKED[result.id])
    assert HOOKED[result.id] == [("after_return", "RetryRefused")]
    record = _record(env, result.id)
    assert (record.state, record.attempt, CALLS[result.id]) == ("completed", 1, [(1, 0)])


def test_ret07_self_retry_from_on_failure_is_refused_and_the_job_dead_lettered_once(
        env: Env) -> None:
    """The policy ended the job (ValueError non-retryable, RET-07) and ``on_failure`` asks
    for a retry: ``RetryRefused``, as the attempt is over; the job is dead-lettered once,
    not run again, not lost. (Celery stores the hook's error over the FAILURE result where
    its backend lets a later write win, as natively: the memory one.)"""
    queue = env.take_queue()
    result = env.tasks["hooked"].apply_async(
        ("on_failure",), queue=queue,
        retry_policy={"non_retryable_errors": ["ValueError"], "on_exhaustion": "dead_letter"})
    with pytest.raises((JobDeadLettered, RetryRefused)):
        result.get(**GET)
    wait_for(lambda: HOOKED[result.id])
    assert HOOKED[result.id][0] == ("on_failure", "RetryRefused")
    [letter] = drain(env.app, f"{queue}.dead_letter", expect=2, timeout=3)
    assert letter.headers["id"] == result.id
    record = _record(env, result.id)
    assert (record.outcome, record.attempt, CALLS[result.id]) == ("dead_letter", 1, [(1, 0)])
