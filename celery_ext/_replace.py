"""``Task.replace`` in a worker: the job goes on as the replacement, in a round of its own.

Celery sends the replacement with the replaced task's id and ``replaced_task_nesting`` one
higher, so its attempts claim keys of a new round (``_handoff.claim_key``) and rank above
every attempt of the task it replaced (``handoff.record_rank``): admitted whatever attempt
that task was on. Before the send, ``prepare`` gives the task that takes the id the job's
history, key, replay round and a copy token of its own. Once Celery has sent it, the record
is reset to attempt 0 of the new round, still ``active`` (the job goes on), naming the
replacement (``hand_over``): the replaced message, should it come back, is a duplicate.
Nothing is written before the send, so a send that fails leaves the attempt to fail as any
other, and no crash can leave a reset without its replacement.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from celery.canvas import Signature, _chain, _chord

from celery_ext._handoff import TOKEN_HEADER, new_token, with_retry
from celery_ext._headers import HEADER, HeaderState
from celery_ext._seat import AttemptSeat, logger
from ojs_adapters import JobRecord
from ojs_adapters.runtime.backend_retry import count_failure
from ojs_adapters.runtime.dlq import REPLAY_HEADER
from ojs_adapters.runtime.handoff import REPLACED

#: Record key: the name of the task that replaced the job's last task.
REPLACED_BY = "replaced_by"
#: Record keys of the replay round (``ReplayMark``), dropped when the replacement does not
#: carry the replay header on.
REPLAY_KEYS = frozenset({"replay_count", "last_replayed_at"})
#: Attribute of the task request holding its running delivery (``AttemptSeat``).
SEAT_ATTRIBUTE = "ojs_seat"


def replaced_info(seat: AttemptSeat) -> dict[str, int]:
    """The record's ``REPLACED`` count for ``seat``'s delivery (none if never replaced)."""
    nesting = seat.rounds[0]
    return {REPLACED: nesting} if nesting else {}


def prepare(seat: AttemptSeat, sig: Any) -> Signature | None:
    """Before Celery sends ``sig``: the nesting OJS counts on it, and the job carried on to
    the task that takes the id (returned; ``None`` where that is no plain task)."""
    nesting = seat.rounds[0] + 1
    if seat.request.replaced_task_nesting != seat.rounds[0]:
        # Celery added 1 to a value it cannot count by: count it ours
        for each in [sig, *(sig.tasks if isinstance(sig, _chain) else ())]:
            each.set(replaced_task_nesting=nesting)
    holder = _id_holder(sig, seat.request.id)
    if holder is not None:
        _carry_on(seat, holder)
    return holder


def hand_over(seat: AttemptSeat, record: JobRecord, sig: Any,
              holder: Signature | None) -> None:
    """Once Celery has sent ``sig``: the job record (``record``: the running attempt's)
    reset to attempt 0 of the replacement's round, unless the replacement stored its own
    already (an ordered save). A store out of reach is logged: the job goes on anyway."""
    seat.replaced = True
    extra = {**record.extra, REPLACED: seat.rounds[0] + 1,
             REPLACED_BY: str(getattr(holder or sig, "name", None) or type(sig).__name__)}
    if holder is None or REPLAY_HEADER not in (seat.request.headers or {}):
        extra = {k: v for k, v in extra.items() if k not in REPLAY_KEYS}  # not carried on
    reset = replace(record.started(0), extra=extra)
    try:
        with_retry(seat.task.app, lambda: seat.store.save(reset),
                   operation="write job record")
    except Exception:
        count_failure("write job record", "failed")
        logger.warning("%s[%s]: replaced, but the job record cannot say so", seat.task.name,
                       seat.request.id, exc_info=True)


def _id_holder(sig: Any, job_id: str) -> Signature | None:
    """The one task of ``sig`` Celery gives the job's id (``sig`` itself; a chain's last
    task, or its first when the replaced task sat in a chain itself; a chord's body);
    ``None`` where that is no plain task (a nested canvas)."""
    tasks = sig.tasks if isinstance(sig, _chain) else [sig.body] if isinstance(
        sig, _chord) else [sig]
    for each in tasks:
        if type(each) is Signature and each.id == job_id:
            return each
    return None


def _carry_on(seat: AttemptSeat, sig: Signature) -> None:
    """The job's history, idempotency key and replay round, in the replacement's headers
    (its own are kept; ``OjsTask.apply_async`` keeps an ``ojs`` header it is given)."""
    request_headers = seat.request.headers or {}
    state = HeaderState(errors=seat.state.errors,
                        idempotency_key=seat.state.idempotency_key or str(seat.request.id))
    carried = {HEADER: state.encode(), TOKEN_HEADER: new_token()}  # a copy of its own
    if REPLAY_HEADER in request_headers:
        carried[REPLAY_HEADER] = request_headers[REPLAY_HEADER]
    sig.set(headers={**carried, **(sig.options.get("headers") or {})})
