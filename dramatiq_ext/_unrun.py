"""Dramatiq deliveries that end without an OJS decision: skipped, or interrupted unadmitted.

``SkipMessage`` (from the actor, or from a middleware such as ``AgeLimit``) ends a job
outside the retry policy: Dramatiq acks it, or nacks it into ``.XQ`` if it was failed.
Its record says so (``discarded``, with ``end_reason``), as a Celery job its handler
ended with ``Ignore`` does. An interrupt (``TimeLimitExceeded``, a shutdown's
``Shutdown``) raised into a delivery before admission let it run is no attempt: the
delivery is given back unrun, as one that waited too long (docs/lifecycle.md).
"""

from __future__ import annotations

from dataclasses import replace

from dramatiq.broker import MessageProxy

from dramatiq_ext._alerts import dead_lettered
from dramatiq_ext._held_ack import Pending
from dramatiq_ext._records import Records
from dramatiq_ext._state import MessageState
from ojs_adapters import JobRecord
from ojs_adapters.runtime.handoff import rank_of

#: Attribute of a ``MessageProxy`` admission let run (its verdict was "run").
ADMITTED = "_ojs_admitted"


def skipped_record(record: JobRecord, *, failed: bool) -> JobRecord:
    """``record`` (the attempt's ``active`` one) after a ``SkipMessage``: discarded, saying
    why; dead-lettered if the message was failed into ``.XQ``.

    >>> r = skipped_record(JobRecord("j", "t", "q", 3, attempt=2), failed=True)
    >>> r.state, r.dead_lettered, r.outcome, r.extra["end_reason"]
    ('discarded', True, 'dead_letter', 'skipped (SkipMessage), failed into the dead-letter queue')
    """
    reason = "skipped (SkipMessage)" + (", failed into the dead-letter queue" if failed else "")
    return replace(record, state="discarded", next_retry_at=None, dead_lettered=failed,
                   outcome="dead_letter" if failed else "discarded",
                   extra={**record.extra, "end_reason": reason})


def end_skipped(message: MessageProxy, state: MessageState, records: Records,
                started: JobRecord | None, fresh: JobRecord) -> None:
    """Save the record of a skipped delivery. ``started``: the ``active`` record admission
    wrote (``None``: skipped before our hook, e.g. by ``AgeLimit``; then ``fresh``, only
    over no record or an earlier attempt's: a stale copy of this attempt, its ack lost or
    sent twice, must not end a job that finished or still runs)."""
    if started is None:
        stored = records.load(message.message_id)
        if stored is not None and rank_of(stored) >= rank_of(fresh):
            return  # this attempt, or a later one, is in hand elsewhere (or over): not ours
        started = fresh
    if records.save(skipped_record(started, failed=message.failed)) and message.failed:
        dead_lettered(message, state)  # a dead letter appeared in .XQ: the hooks hear of it


def given_back(message: MessageProxy) -> Pending:
    """The hand-off that gives ``message`` back to its queue unrun (the same copy, its token
    kept: to the claims, a redelivery)."""
    return Pending(message.copy(), None, {}, None, mark=False, hand_back=True)
