"""``Task.replace`` in a worker: the job goes on as the replacement, in a round of its own.

Celery sends the replacement with the replaced task's id and ``replaced_task_nesting`` one
higher, so its attempts claim keys of a new round (``_handoff.claim_key``). Before it is
sent, the job record is reset to attempt 0, still ``active`` (the job goes on), naming the
replacement: its first attempt is then new to the record, whatever attempt the replaced
task was on, and the replaced delivery leaves the record as it is (``Ignore`` undoes
nothing). A reset that cannot be stored fails the attempt: sent without it, the
replacement would be dropped as a duplicate. A replacement Celery cannot send puts the
attempt's record back (``take_back``) and fails the attempt.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from celery.canvas import Signature, _chain, _chord

from celery_ext._handoff import replaced_round, with_retry
from celery_ext._headers import HEADER, HeaderState
from celery_ext._seat import AttemptSeat, logger
from ojs_adapters import JobRecord
from ojs_adapters.runtime.dlq import REPLAY_HEADER
from ojs_adapters.runtime.handoff import REPLACED

#: Record key: the name of the task that replaced the job's last task.
REPLACED_BY = "replaced_by"
#: Record keys of the replay round (``ReplayMark``), dropped when the replacement does not
#: carry the replay header on.
REPLAY_KEYS = frozenset({"replay_count", "last_replayed_at"})
#: Attribute of the task request holding its running delivery (``AttemptSeat``).
SEAT_ATTRIBUTE = "ojs_seat"


def replaced_info(request: Any) -> dict[str, int]:
    """The record's ``REPLACED`` count for a delivery of ``request`` (none if never)."""
    nesting = replaced_round(getattr(request, "replaced_task_nesting", 0))
    return {REPLACED: nesting} if nesting else {}


def hand_over(seat: AttemptSeat, record: JobRecord, sig: Any) -> None:
    """Reset the job record (``record``: the running attempt's) for ``sig``, the replacement
    of ``seat``'s delivery, before Celery sends it (``OjsTask.on_replace``). Raises
    ``OjsBackendError`` if the store stays out of reach."""
    raw = seat.request.replaced_task_nesting
    nesting = replaced_round(raw) + 1
    if raw != nesting - 1:  # Celery added 1 to a value it cannot count by: count it ours
        for each in [sig, *(sig.tasks if isinstance(sig, _chain) else ())]:
            each.set(replaced_task_nesting=nesting)
    holder = _id_holder(sig, seat.request.id)
    extra = {**record.extra, REPLACED: nesting,
             REPLACED_BY: str(getattr(holder or sig, "name", None) or type(sig).__name__)}
    if holder is None or REPLAY_HEADER not in (seat.request.headers or {}):
        extra = {k: v for k, v in extra.items() if k not in REPLAY_KEYS}  # not carried on
    reset = replace(record.started(0), extra=extra)
    with_retry(seat.task.app, lambda: seat.store.save(reset, force=True),
               operation="write job record")
    seat.replaced = True
    if holder is not None:
        _carry_on(seat, holder)


def take_back(seat: AttemptSeat, record: JobRecord) -> None:
    """Undo ``hand_over`` when the replacement was not sent: ``record`` (the running
    attempt's) back over the reset, so the attempt's failure is stored and its retry runs
    (kept, a reset of a later round would make that retry a duplicate)."""
    seat.replaced = False
    try:
        with_retry(seat.task.app, lambda: seat.store.save(record, force=True),
                   operation="write job record")
    except Exception:
        logger.error("%s[%s]: the replacement was not sent and the job record cannot be "
                     "put back; its retry may be taken for a duplicate", seat.task.name,
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
    carried = {HEADER: state.encode()}
    if REPLAY_HEADER in request_headers:
        carried[REPLAY_HEADER] = request_headers[REPLAY_HEADER]
    sig.set(headers={**carried, **(sig.options.get("headers") or {})})
