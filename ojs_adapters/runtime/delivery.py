"""One delivery's lifecycle after admission: decide on a failed attempt, then carry it out.

Both adapters follow it step by step; each supplies an ``Outcome`` (how it saves a
record, hands a retry to its broker, ends a job, and reports) and translates its hooks:

1. ``admission.admit``: lease, claim, judge (a repeated delivery never runs twice).
2. The body runs; a failure becomes a ``Failure`` and ``decide`` rules on it.
3. ``carry_out``: the record's transition; a retry is saved *before* it is published (its
   attempt may start at once), or with it in one atomic step, and handed off (the
   original is acked only once the broker took it); a dead letter, a discard or a fail
   ends the job. Each decision is reported once.

A retry that cannot be published for a reason other than the broker (it cannot be
encoded, a router or middleware refuses it) would fail alike on every try: it is decided
again (``Failure.unpublishable``: dead letter), and only that decision is reported.
docs/lifecycle.md has the reasoning.
"""

from __future__ import annotations

import logging
from typing import Protocol

from ojs_adapters.decision import Decision, decide
from ojs_adapters.failure import Failure
from ojs_adapters.history import JobRecord
from ojs_adapters.policy import RetryPolicy


class Unpublished(Exception):
    """A successor the broker never saw, for a reason other than the broker (``cause``)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(cause)
        self.cause = cause


class Outcome(Protocol):
    """How one adapter carries out a decision for one delivery."""

    policy: RetryPolicy
    label: str  # "<task>[<job id>]", for the log lines
    logger: logging.Logger

    def failed(self, record: JobRecord, decision: Decision) -> JobRecord:
        """``record`` after ``decision`` (with what the adapter keeps besides)."""

    def hand_off(self, record: JobRecord, decision: Decision) -> None:
        """Publish the retry ``record`` decided, the record stored first (the retry may
        start at once and must find it) or in one atomic step with the publish; report
        ``decision``; mark the record handed off. Raise ``Unpublished`` if it cannot be
        published but by the broker."""

    def end(self, record: JobRecord, decision: Decision) -> None:
        """Dead-letter, discard or fail the job as ``decision`` says, and report it."""


def carry_out(outcome: Outcome, record: JobRecord, decision: Decision) -> None:
    """Carry out ``decision`` on the failed attempt whose record is ``record``."""
    record = outcome.failed(record, decision)
    if decision.action == "retry":
        try:
            outcome.hand_off(record, decision)
            return
        except Unpublished as error:
            record, decision = redecided(outcome, record, error.cause)
    outcome.end(record, decision)


def redecided(outcome: Outcome, record: JobRecord,
              cause: BaseException) -> tuple[JobRecord, Decision]:
    """The record and decision of a retry (``record``) that cannot be published: the job is
    dead-lettered with a history entry naming why (``Failure.unpublishable``)."""
    decision = decide(outcome.policy, record.attempt, Failure.unpublishable("retry", cause))
    outcome.logger.error("%s: %s; dead-lettering the job", outcome.label,
                         decision.entry.message, exc_info=cause)
    return outcome.failed(record, decision), decision
