"""The retry decision: the one place that says what happens after a failed attempt.

``decide(policy, attempt, error)`` applies, in order (ojs-retry.md sections 6, 7
and 9.2; RET-01, RET-07, RET-08, RET-18):

1. the handler response code: ``DISCARD``, ``FAIL`` and ``DEAD_LETTER`` end the
   job at once; ``RETRY`` (or none) goes on;
2. ``non_retryable_errors`` (exact, ``prefix.*``, base-class names), and the
   catalog's word for an ``OjsError`` (ERR-014, ERR-015): a match ends the job
   as ``on_exhaustion`` says. A stalled attempt (worker lost, visibility
   timeout) skips this step (section 9.2);
3. remaining attempts: ``attempt >= max_attempts`` (and ``max_attempts`` 0 or
   1) exhausts the job, again as ``on_exhaustion`` says;
4. backoff: the delay for retry number ``attempt``.

Frameworks only execute the returned ``Decision``.

>>> from ojs_adapters import RetryPolicy
>>> d = decide(RetryPolicy(), 1, ValueError("boom"), jitter_sample=0.5)
>>> (d.action, d.delay, d.entry.code)
('retry', 1.0, 'HANDLER_ERROR')
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from random import random as _random
from typing import Literal, NamedTuple, Protocol, cast

from ojs_adapters.errors import OjsValidationError
from ojs_adapters.failure import Failure, describe_failure
from ojs_adapters.history import (
    ErrorEntry,
    Outcome,
    bound_message,
    iso_from_epoch,
    iso_utc,
    safe_details,
)
from ojs_adapters.policy import RetryPolicy, check_jitter_sample

#: What the framework must do with the job.
Action = Literal["retry", "discard", "dead_letter", "fail"]
#: Why: the rule that produced the action.
Reason = Literal["handler_code", "non_retryable", "not_retryable_code", "exhausted",
                 "max_duration", "budget", "retry"]


class RetryBudget(Protocol):
    """What ``decide`` asks of a retry budget (integration standard R-7)."""

    def allow_retry(self) -> bool:
        """Take a retry from the budget if one is left; ``False`` suppresses the retry."""
        ...

# Build the NamedTuples without their generated __new__ (several times slower).
_new_entry = cast(Callable[..., ErrorEntry], tuple.__new__)
_new = cast(Callable[..., "Decision"], tuple.__new__)

_OUTCOMES: dict[str, Outcome] = {
    "discard": "discarded", "fail": "failed", "dead_letter": "dead_letter",
}


class Decision(NamedTuple):
    """The verdict on one failed attempt, and the history entry to record for it.

    ``delay`` is in seconds and set only for ``retry``; ``jitter_sample`` is the
    u in [0, 1) that produced it (``None`` with jitter off), so a reader can
    recompute ``policy.delay(attempt, jitter_sample=u)`` exactly. Immutable; a
    ``NamedTuple`` because it is built on every failure (see ``Failure``).
    """

    action: Action
    reason: Reason
    attempt: int
    entry: ErrorEntry
    delay: float | None = None
    jitter_sample: float | None = None
    matched: str | None = None

    @property
    def next_attempt(self) -> int | None:
        """The attempt number a retry will run as."""
        return self.attempt + 1 if self.action == "retry" else None

    @property
    def outcome(self) -> Outcome | None:
        """How the job ended (``None`` while it will be retried)."""
        return _OUTCOMES.get(self.action)

    @property
    def terminal(self) -> bool:
        """Whether the job ends here."""
        return self.action != "retry"

    @property
    def exhausted(self) -> bool:
        """Whether the job ran out of attempts, time or retry budget (not stopped early)."""
        return self.reason in ("exhausted", "max_duration", "budget")


def decide(
    policy: RetryPolicy,
    attempt: int,
    error: BaseException | Failure,
    *,
    jitter_sample: float | None = None,
    now: datetime | None = None,
    previous_delay: float | None = None,
    first_attempt_at: float | None = None,
    budget: RetryBudget | None = None,
) -> Decision:
    """Decide what follows failed attempt ``attempt`` (1-indexed) of a job under ``policy``.

    ``error`` is what the handler raised, or a ``Failure`` an adapter built
    (a lost worker, a time limit). ``jitter_sample`` fixes the jitter draw
    (tests and conformance); by default one is drawn.

    Opt-in extensions: ``previous_delay`` feeds decorrelated jitter;
    ``first_attempt_at`` (POSIX seconds) lets ``max_duration`` exhaust a job whose
    next attempt would start too late, a ``retry_after`` included (R-3, R-5);
    ``budget`` may suppress the retry (R-7). Each exhausts with its own reason.
    """
    if type(attempt) is not int or attempt < 1:
        raise OjsValidationError(
            f"attempt must be an integer >= 1, got {attempt!r}", code="INVALID_ARGS",
            details={"field": "attempt", "value": repr(attempt), "rule": "integer >= 1"},
        )
    failure = error if type(error) is Failure else describe_failure(error)  # cached per class
    exhaust: Action = "dead_letter" if policy.on_exhaustion == "dead_letter" else "discard"
    code = failure.catalog_code
    action: Action | None = None
    reason: Reason = "retry"
    matched: str | None = None

    handler = failure.handler_code
    if handler == "DISCARD":
        action, reason = "discard", "handler_code"
    elif handler == "FAIL":
        action, reason = "fail", "handler_code"
    elif handler == "DEAD_LETTER":
        action, reason = "dead_letter", "handler_code"
    elif not failure.stalled:
        matched = policy.matching_entry(failure.names)
        if matched is not None:
            action, reason, code = exhaust, "non_retryable", "NON_RETRYABLE_ERROR"
        elif failure.retryable is False and handler != "RETRY":
            action, reason = exhaust, "not_retryable_code"
    if action is None and attempt >= policy.max_attempts:
        action, reason = exhaust, "exhausted"

    # tuple.__new__ directly: a NamedTuple's generated __new__ costs several times more,
    # and this runs on every failure (bench/core.py measures it).
    entry = _new_entry(ErrorEntry, (
        attempt,
        code,
        failure.type,
        bound_message(failure.message),
        iso_utc(now) if now is not None else iso_from_epoch(time.time()),
        handler,
        safe_details(failure.details) if failure.details else None,
        None,  # replay_round: a replay stamps it when it closes the round
    ))
    if action is not None:
        return _new(Decision, (action, reason, attempt, entry, None, None, matched))

    sample = None
    if policy.jitter:
        if jitter_sample is None:
            sample = _random()
        else:
            check_jitter_sample(jitter_sample)
            sample = jitter_sample
    delay = policy._jittered(attempt, sample, previous_delay)
    if failure.retry_after is not None and failure.retry_after > delay:
        delay = float(failure.retry_after)
    limit = policy.max_duration
    if limit is not None and first_attempt_at is not None:
        moment = now.timestamp() if now is not None else time.time()
        if moment + delay > first_attempt_at + limit.total_seconds():
            return _new(Decision, (exhaust, "max_duration", attempt, entry, None, None, None))
    if budget is not None and not budget.allow_retry():
        return _new(Decision, (exhaust, "budget", attempt, entry, None, None, None))
    return _new(Decision, ("retry", "retry", attempt, entry, delay, sample, None))
