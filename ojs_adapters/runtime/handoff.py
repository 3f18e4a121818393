"""Handing a job from one attempt to the next: error headers, attempt ids, duplicate checks.

Both adapters hand a failed job on by publishing a successor (the retry, or the
dead-letter copy) and acknowledging the original only after the broker accepted
it. A crash between the two leaves both on the broker; this module says what a
delivery is, so the adapters run every attempt at most once:

- ``attempt_id(job_id, attempt)``: the stable id of one attempt (``<job id>:<n>``).
- ``error_headers(entry, attempt)``: the ``x-ojs-*`` headers of a republished
  failed job (ojs-errors.md section 5.3, ERR-008). Built from the history entry
  only: a job's arguments never go into them.
- ``judge_delivery(record, attempt, claim=...)``: what to do with a delivery, given
  the job record and the attempt's claim (each published copy carries a token; the
  first copy to claim an attempt owns it).
- ``record_rank(data)`` and ``ORDERED_SAVE_LUA``: records are saved in order. The
  ``handed_off`` mark is written after the successor was accepted, and the successor
  may run (and store its own record) first: a save never replaces a record of a later
  attempt, or of a later round (a ``Task.replace`` replacement, a replayed dead letter:
  ``is_newer``; on Redis, atomically, in one round trip).

>>> error_headers(ErrorEntry(1, "HANDLER_ERROR", "SmtpError", "refused", "2026-02-15T10:30:00Z"),
...               2)["x-ojs-error-details"]
'{"type":"SmtpError","attempt":1,"occurred_at":"2026-02-15T10:30:00Z"}'
>>> judge_delivery(None, 1)
'run'
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Literal

from ojs_adapters.history import ErrorEntry, JobRecord

#: The AMQP header names of ojs-errors.md section 5.3 (and the attempt of section 12.4).
ERROR_CODE_HEADER = "x-ojs-error-code"
ERROR_MESSAGE_HEADER = "x-ojs-error-message"
ERROR_DETAILS_HEADER = "x-ojs-error-details"
ATTEMPT_HEADER = "x-ojs-attempt"
#: Every header ``error_headers`` writes.
HEADER_NAMES = (ERROR_CODE_HEADER, ERROR_MESSAGE_HEADER, ERROR_DETAILS_HEADER, ATTEMPT_HEADER)
#: Longest ``x-ojs-error-message`` value, in characters (headers live in every frame).
MAX_HEADER_MESSAGE = 1024
#: Record key (in ``JobRecord.extra``) naming the successor the broker accepted.
HANDED_OFF = "handed_off"
#: ``HANDED_OFF`` value once the dead-letter copy was accepted.
DEAD_LETTER_SUCCESSOR = "dead_letter"

#: Record key (in ``JobRecord.extra``): how many times ``Task.replace`` replaced the job
#: (Celery's ``replaced_task_nesting``); each replacement starts a new round of attempts.
REPLACED = "replaced_task_nesting"
#: Record key: how many times a dead-letter replay sent the job again (a round too).
REPLAYED = "replay_count"

#: Lua: ``rank_of(data)``, a decoded record's ``record_rank``; ``above(a, b)``, whether
#: rank ``a`` is above rank ``b``.
RANK_LUA = """
local function rank_of(data)
    return {tonumber(data["replaced_task_nesting"]) or 0, tonumber(data["replay_count"]) or 0,
            tonumber(data["attempt"]) or 0}
end
local function above(a, b)
    for i = 1, 3 do
        if a[i] ~= b[i] then return a[i] > b[i] end
    end
    return false
end
"""

#: Redis script: save a job record unless the stored one ranks higher (``record_rank``).
#: KEYS[1]: the record's key. ARGV: [1] the record (JSON text), [2] its replacement round,
#: [3] its replay round, [4] its attempt, [5] time to live in ms (0: none), [6] "string"
#: (``SET``) or "list" (a one-element list, as Dramatiq's Redis result backend keeps
#: values). A stored value that is not a JSON object is replaced. Returns 1 if written, 0
#: if kept. With KEYS[2] (an attempt's lease) and ARGV[7] (its holder), the lease is
#: released too, if that holder still holds it: the outcome and the release in one round
#: trip (``leases``). ``ORDERED_SAVE_BODY`` is the save alone (KEYS[1], ARGV[1..6]): a
#: script that adds to it reads its own arguments from ARGV[SAVE_ARGC + 1] on.
SAVE_ARGC = 6
ORDERED_SAVE_BODY = RANK_LUA + """
local list = ARGV[6] == "list"
local held
if list then held = redis.call("LINDEX", KEYS[1], 0) else held = redis.call("GET", KEYS[1]) end
if held then
    local ok, old = pcall(cjson.decode, held)
    if ok and type(old) == "table" and
            above(rank_of(old), {tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])}) then
        return 0
    end
end
local ttl = tonumber(ARGV[5])
if list then
    redis.call("DEL", KEYS[1])
    redis.call("LPUSH", KEYS[1], ARGV[1])
    if ttl > 0 then redis.call("PEXPIRE", KEYS[1], ttl) end
elseif ttl > 0 then
    redis.call("SET", KEYS[1], ARGV[1], "PX", ttl)
else
    redis.call("SET", KEYS[1], ARGV[1])
end
return 1
"""
ORDERED_SAVE_LUA = f"""
if #KEYS > 1 and redis.call("GET", KEYS[2]) == ARGV[{SAVE_ARGC + 1}] then
    redis.call("DEL", KEYS[2])
end
""" + ORDERED_SAVE_BODY

#: The attempt's claim as this copy found it: just taken by this copy ("new"), taken
#: by this same copy on an earlier delivery ("mine"), or held by another copy ("other").
Claim = Literal["new", "mine", "other"]
#: What a delivery is: run it; count its lost previous run (RET-12); publish the
#: successor again (its first publish may not have landed); redo the terminal step
#: (the dead letter may not have landed); or drop it, a duplicate.
Verdict = Literal["run", "lost", "resend", "redo_dead_letter", "duplicate"]


def attempt_id(job_id: str, attempt: int) -> str:
    """The stable id of attempt ``attempt`` of job ``job_id``.

    >>> attempt_id("7c1e", 2)
    '7c1e:2'
    """
    return f"{job_id}:{attempt}"


def error_headers(entry: ErrorEntry, attempt: int) -> dict[str, Any]:
    """The ``x-ojs-*`` headers of a job republished after the failure ``entry``.

    ``x-ojs-attempt`` is ``attempt``: for a retry the attempt it runs as (as in
    ojs-errors.md section 12.4), for a dead letter the last attempt that ran.
    """
    details: dict[str, Any] = {"type": entry.type, "attempt": entry.attempt,
                               "occurred_at": entry.occurred_at}
    if entry.handler_code:
        details["handler_code"] = entry.handler_code
    if entry.details:
        details["details"] = dict(entry.details)
    message = entry.message or entry.code
    if len(message) > MAX_HEADER_MESSAGE:
        message = message[:MAX_HEADER_MESSAGE] + "..."
    return {
        ERROR_CODE_HEADER: entry.code,
        ERROR_MESSAGE_HEADER: message,
        ERROR_DETAILS_HEADER: json.dumps(details, separators=(",", ":"), default=repr),
        ATTEMPT_HEADER: attempt,
    }


def record_rank(data: Mapping[str, Any]) -> tuple[int, int, int]:
    """Where a stored record (``JobRecord.to_dict()``) stands: ``(replacement round, replay
    round, attempt)``; a replacement's attempts rank above its replaced task's.

    >>> record_rank({"attempt": 2, "replay_count": 1}), record_rank({})
    ((0, 1, 2), (0, 0, 0))
    """
    return (_count(data.get(REPLACED)), _count(data.get(REPLAYED)),
            _count(data.get("attempt")))


def rank_of(record: JobRecord) -> tuple[int, int, int]:
    """``record_rank`` of a ``JobRecord``.

    >>> rank_of(JobRecord("j", "t", "q", 3, attempt=2, extra={"replaced_task_nesting": 1}))
    (1, 0, 2)
    """
    return _count(record.extra.get(REPLACED)), _count(record.extra.get(REPLAYED)), record.attempt


def is_newer(stored: Mapping[str, Any] | None, record: Mapping[str, Any]) -> bool:
    """Whether ``stored`` ranks above ``record``: then saving ``record`` must keep ``stored``.

    >>> is_newer({"attempt": 2}, {"attempt": 1}), is_newer({"attempt": 2}, {"attempt": 2})
    (True, False)
    >>> is_newer({"attempt": 2}, {"attempt": 0, "replay_count": 1})
    False
    """
    return stored is not None and record_rank(stored) > record_rank(record)


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def successor_of(record: JobRecord) -> str:
    """The ``HANDED_OFF`` value that says ``record``'s successor was accepted by the broker."""
    if record.state == "retryable":
        return attempt_id(record.id, record.attempt + 1)
    return DEAD_LETTER_SUCCESSOR


def handed_off(record: JobRecord) -> JobRecord:
    """``record`` marked: its successor is on the broker (write it after the publish)."""
    return replace(record, extra={**record.extra, HANDED_OFF: successor_of(record)})


def judge_delivery(record: JobRecord | None, attempt: int, *, claim: Claim = "new",
                   rounds: tuple[int, int] = (0, 0)) -> Verdict:
    """What to do with a delivery of ``attempt`` in ``rounds`` (its replacement and replay
    rounds), given the job ``record`` and the ``claim``.

    Another copy's claim makes this one a duplicate, and so does a record of a later
    attempt or round. This copy's own earlier claim with a record that never saw the
    attempt start means its earlier delivery ran while the store was unreachable: that
    attempt is lost (RET-12), not run again.

    >>> rec = JobRecord("j", "t", "q", 3).started(2)
    >>> judge_delivery(rec, 2), judge_delivery(rec, 2, claim="other"), judge_delivery(rec, 1)
    ('lost', 'duplicate', 'duplicate')
    >>> judge_delivery(rec, 3), judge_delivery(rec, 3, claim="mine")
    ('run', 'lost')
    >>> judge_delivery(rec, 1, rounds=(1, 0)), judge_delivery(rec, 3, rounds=(0, 0))
    ('run', 'run')
    """
    if claim == "other":
        return "duplicate"
    rank = (*rounds, attempt)
    stored = (-1,) if record is None else rank_of(record)  # no record: below every rank
    if stored < rank:
        return "lost" if claim == "mine" else "run"
    if record is None or stored > rank:
        return "duplicate"
    accepted = record.extra.get(HANDED_OFF) == successor_of(record)
    if record.state == "active":
        return "lost"
    if record.state == "retryable":
        return "duplicate" if accepted else "resend"
    if record.state == "discarded" and record.dead_lettered and not accepted:
        return "redo_dead_letter"
    return "duplicate"
