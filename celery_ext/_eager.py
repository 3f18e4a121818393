"""An eager ``OjsTask`` call inside ``instant_retries()``: every attempt in place, no waiting.

Celery's eager mode (``task_always_eager``, ``apply()``) runs the body once in the
caller, and an ``OjsTask`` then skips its policy (``_checks.warn_eager_once``). Inside
``ojs_adapters.testing.instant_retries()`` it runs the job as a worker would instead,
attempt after attempt in the same call, and only the waiting is skipped:

- the same inputs: the ``ojs`` header (``_headers``), the policy it names over the
  task's (``task.policy``), the jitter source, ``self.retry(exc=, countdown=)``;
- the same choice: ``ojs_adapters.decide``, with the previous countdown, the first
  attempt's time and the task's retry budget;
- the same record, written where ``get_job_record`` reads it (the app's result
  backend) at the same steps: ``active`` as an attempt starts, ``retryable`` with its
  countdown, then ``completed`` or ``discarded``; the same ``DecisionEvent``;
- the next attempt's headers built as the retry message's would be (attempt, history,
  countdowns, ``x-ojs-*``), so ``self.ojs`` and ``self.request`` look the same;
- the same end: ``JobDiscarded`` or ``JobDeadLettered`` carrying the record, so
  ``EagerResult.get()`` raises what ``AsyncResult.get()`` would.

What is not done, there being no broker: no retry or dead letter is published (the
record of a dead-lettered job has no ``handed_off`` mark, and ``<queue>.dead_letter``
gets nothing); no lease, claim or redelivery check (nothing else delivers the job).
The policy helpers are the worker's own (``_inputs``: the header's policy, the jitter
source, the terminal exception, a handler's retry request), so the paths cannot drift apart.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from functools import partial
from typing import Any, NoReturn

from celery.exceptions import Ignore, Reject, SoftTimeLimitExceeded, TimeLimitExceeded

from celery_ext._budgets import budget_of
from celery_ext._current import CONTEXT_ATTRIBUTE, RUNNING
from celery_ext._headers import HEADER, HeaderState, merged
from celery_ext._inputs import header_policy, raise_terminal, task_jitter_sample
from celery_ext._routing import dead_letter_queue_for, queue_of
from celery_ext._seat import ended_record
from celery_ext._self_retry import NEXT_CALL, body_failure, eager_call, without_call
from celery_ext.dlq import replay_info
from celery_ext.records import RecordStore
from ojs_adapters import JobContext, JobRecord, RetryPolicy, decide
from ojs_adapters.failure import Failure, describe_failure
from ojs_adapters.runtime._instant import (
    answers_key,
    block_state,
    jitter_sample,
    note_job,
    note_record,
    set_block_state,
)
from ojs_adapters.runtime.events import DecisionEvent, emit
from ojs_adapters.runtime.handoff import error_headers

logger = logging.getLogger("celery_ext")


def run_eager(task: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run an eager call of ``task`` to its end under its policy; return the body's result."""
    job = _EagerJob(task)
    while True:
        done, result = job.attempt(args, kwargs)
        if done:
            return result
        call, job.next_call = job.next_call, None  # ``self.retry(args=...)`` of the last attempt
        if call:
            args, kwargs = eager_call(task, call)
            job.request.args, job.request.kwargs = list(args), kwargs


class _EagerJob:
    """One eager job across its attempts; ``read`` takes the state a delivery would have."""

    def __init__(self, task: Any) -> None:
        self.task = task
        self.request = task.request
        self.store = RecordStore(task.backend)
        self.queue = queue_of(task.app, self.request.delivery_info)
        self.dependency: str | None = getattr(type(task), "retry_budget", None)
        self.next_call: Any = None  # the arguments the next attempt runs with, if new
        self.read(self.request.headers)
        note_job("celery", str(self.request.id), task.app)

    def read(self, headers: Any) -> None:
        """The state, policy and base record of a delivery carrying ``headers``."""
        self.state = HeaderState.from_headers(headers)
        self.policy: RetryPolicy = header_policy(self.task, self.state)
        self.first_attempt_at = self.state.first_attempt_at or time.time()
        self.key = self.state.idempotency_key or str(self.request.id)
        self.base = JobRecord(
            id=self.request.id, type=self.task.name, queue=self.queue,
            max_attempts=self.policy.max_attempts, errors=self.state.errors,
            extra={"countdowns": list(self.state.countdowns),
                   "jitter_samples": list(self.state.jitter_samples),
                   "retry_policy": self.policy.to_dict(),
                   "idempotency_key": self.key,
                   **replay_info(headers)})

    def attempt(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[bool, Any]:
        """Run attempt ``state.attempt``: ``(True, result)``, or ``(False, None)`` when a
        retry was decided (the next attempt is then read in); raises when the job ends."""
        if self.state.invalid is not None:  # unreadable OJS state: dead-lettered unrun
            self.end(self.state.invalid, None)
        self.save(self.base.started(self.state.attempt))
        self.start()
        try:
            result = self.run(args, kwargs)
        except (Ignore, Reject) as raised:
            # Celery control flow the handler chose: the job ends (nothing requeues here).
            self.save(ended_record(self.base.started(self.state.attempt), raised))
            raise
        except (SoftTimeLimitExceeded, TimeLimitExceeded) as exc:
            self.fail(describe_failure(exc, catalog_code="HANDLER_TIMEOUT"), exc)
        except Exception as exc:
            self.fail(*body_failure(self, exc))  # self.retry(...): _self_retry
        else:
            self.save(self.base.started(self.state.attempt).completed())
            return True, result
        return False, None

    def run(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The body, marked running as on a worker: ``self.retry()`` after it (``on_failure``,
        ``after_return``) is refused, not a request nothing would carry out."""
        outer, RUNNING.id = getattr(RUNNING, "id", None), self.request.id
        try:
            return self.task.run(*args, **kwargs)
        finally:
            RUNNING.id = outer

    def start(self) -> None:
        """Show the attempt's context to the body; count it against its retry budget."""
        setattr(self.request, CONTEXT_ATTRIBUTE, JobContext(
            job_id=str(self.request.id), attempt=self.state.attempt, idempotency_key=self.key,
            errors=self.state.errors,
            replay_count=int(self.base.extra.get("replay_count") or 0)))
        if self.dependency is not None:
            budget_of(self.task.app, self.dependency).record_execution()

    def fail(self, error: BaseException | Failure, exc: BaseException | None) -> None:
        """Decide on the failed attempt: read in the next one (retry) or end the job."""
        sample = None
        if self.policy.jitter:
            sample = jitter_sample(partial(task_jitter_sample, self.task))
        budget = budget_of(self.task.app, self.dependency) if self.dependency else None
        decision = decide(
            self.policy, self.state.attempt, error, jitter_sample=sample,
            previous_delay=self.state.countdowns[-1] if self.state.countdowns else None,
            first_attempt_at=self.first_attempt_at, budget=budget)
        if decision.action != "retry":
            self.end(error, exc, decision=decision)
        delay = float(decision.delay or 0.0)
        record = self.base.failed(decision.entry, action="retry", delay=delay)
        record = replace(record, extra={
            **record.extra,
            "countdowns": [*self.state.countdowns, delay],
            "jitter_samples": [*self.state.jitter_samples, decision.jitter_sample]})
        self.save(record)
        self.report(decision)
        # What the retry message would carry (``_attempt.Delivery.schedule_retry``).
        header = replace(
            self.state, attempt=record.attempt + 1, errors=record.errors,
            countdowns=tuple(record.extra["countdowns"]),
            jitter_samples=tuple(record.extra["jitter_samples"]),
            not_before=time.time() + delay, first_attempt_at=self.first_attempt_at,
            idempotency_key=self.key)
        headers = merged(self.request.headers, **{HEADER: header.encode()},
                         **error_headers(record.errors[-1], record.attempt + 1))
        self.request.headers = headers
        self.request.retries = record.attempt  # as Task.retry counts them
        self.next_call = record.extra.get(NEXT_CALL)
        self.read(headers)

    def end(self, error: BaseException | Failure, exc: BaseException | None, *,
            decision: Any = None) -> NoReturn:
        """Store the terminal record and raise ``JobDiscarded`` / ``JobDeadLettered``."""
        if decision is None:
            decision = decide(self.policy, self.state.attempt, error)
        record = without_call(self.base).failed(decision.entry, action=decision.action,
                                                reason=decision.reason)
        if decision.action == "dead_letter":
            record = replace(record, extra={
                **record.extra, "dead_letter_queue": dead_letter_queue_for(self.task, self.queue)})
        self.save(record)
        self.report(decision)
        raise_terminal(self.task, record, exc)

    def report(self, decision: Any) -> None:
        emit(DecisionEvent(framework="celery", job_id=self.request.id, task=self.task.name,
                           queue=self.queue, max_attempts=self.policy.max_attempts,
                           decision=decision, idempotency_key=self.key,
                           dependency=self.dependency))

    def save(self, record: JobRecord) -> None:
        """Store ``record`` as the worker does; a failed write is logged, never raised. A
        backend that does not answer (asked once a block) is not written again in the
        block: the records stay in memory (``retries.record()``), and no test waits out
        the backend's own retries on every save."""
        note_record("celery", record)
        key = answers_key(self.task.app)
        if not block_state(key, partial(_answers, self.task)):
            return
        try:
            self.store.save(record)
        except Exception:
            set_block_state(key, False)
            logger.warning("%s[%s]: cannot store the job record: in this instant_retries() "
                           "block job records stay in memory (retries.record())",
                           self.task.name, self.request.id, exc_info=True)


def _answers(task: Any) -> bool:
    """Whether the task's result backend answers (a client's ``ping``, where it has one);
    said once a block when it does not."""
    ping = getattr(getattr(task.backend, "client", None), "ping", None)
    if not callable(ping):
        return True
    try:
        ping()
    except Exception as error:
        logger.warning("%s: the result backend does not answer (%r): in this "
                       "instant_retries() block job records stay in memory (retries.record()); "
                       "in tests use result_backend = 'cache+memory://'", task.name, error)
        return False
    return True
