"""Claiming an attempt and reading its record in one Redis round trip.

Before an attempt runs, an adapter claims it (``<job id>:<attempt>``, first copy
wins, so a successor published twice runs once), reads the job record (has this
attempt run before?) and, for a new attempt, writes the record ``active``. On Redis
these are one Lua script (``begin_on_redis``): one round trip instead of three on
every attempt. The client is passed in: the runtime imports no Redis library.

A claim value is ``<copy token>|<delivery nonce>``; ``claim_of`` says how a held
value relates to this delivery's.

>>> claim_of("a|1", "a|1"), claim_of("a|1", "a|2"), claim_of("a|1", "b|3")
('new', 'mine', 'other')
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from ojs_adapters.history import JobRecord
from ojs_adapters.runtime.group_commit import run_script
from ojs_adapters.runtime.handoff import RANK_LUA, Claim

# KEYS[1] claim, KEYS[2] record, KEYS[3] (optional) the attempt's lease. ARGV[1] token,
# ARGV[2] claim TTL (ms), ARGV[3] the record to write if this claim is new and the attempt
# is new ('' = never write), ARGV[4] its TTL (ms, '' = none), ARGV[5] the attempt ('' =
# write only when no record exists; else also over a record that ranks below it, with
# ARGV[6] and ARGV[7] its replacement and replay rounds: ``handoff.record_rank``),
# ARGV[8] the lease holder and ARGV[9] its TTL (ms), with KEYS[3]. A lease held by
# another holder stops the script before the claim: the delivery waits (``leases``).
# KEYS[4] (optional, with KEYS[3]) is a key whose value the reply carries besides (Celery's
# result meta, ``AdmissionReply.peeked``).
_ADMIT_LUA = RANK_LUA + """
if #KEYS > 2 then
  local holder = redis.call('GET', KEYS[3])
  if holder and holder ~= ARGV[8] then return {0, false, false, 0, 0, false} end
  redis.call('SET', KEYS[3], ARGV[8], 'PX', ARGV[9])
end
local peeked = false
if #KEYS > 3 then peeked = redis.call('GET', KEYS[4]) end
local claimed = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
local held = false
if not claimed then held = redis.call('GET', KEYS[1]) end
local record = redis.call('GET', KEYS[2])
local wrote = 0
if claimed and ARGV[3] ~= '' then
  local fresh = not record
  if record and ARGV[5] ~= '' then
    local ok, data = pcall(cjson.decode, record)
    local seen = ok and type(data) == 'table' and tonumber(data['attempt'])
    fresh = (seen and above({tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[5])},
                            rank_of(data))) or false
  end
  if fresh then
    if ARGV[4] ~= '' then
      redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4])
    else
      redis.call('SET', KEYS[2], ARGV[3])
    end
    wrote = 1
  end
end
return {claimed and 1 or 0, held, record, wrote, 1, peeked}
"""


class AdmissionReply(NamedTuple):
    """What ``begin_on_redis`` found: the claim, the stored record (raw), whether it wrote,
    and whether this delivery holds the attempt's lease (``False``: another live delivery
    does, and nothing else was done; ``None``: no lease was asked for)."""

    claim: Claim
    record: bytes | str | None
    wrote: bool
    leased: bool | None = None
    peeked: bytes | str | None = None  # the value of ``peek_key``, read in the same call


def record_of(raw: bytes | str | None) -> JobRecord | None:
    """The ``JobRecord`` in a stored JSON text; ``None`` if there is none or it is unreadable.

    >>> record_of(b'{"id": "j", "attempt": 2}').attempt, record_of(b"junk")
    (2, None)
    """
    if not raw:
        return None
    try:
        return JobRecord.from_dict(json.loads(raw))
    except (ValueError, TypeError, KeyError, RecursionError):
        return None  # an unreadable record is no record: the headers carry the truth


def claim_of(held: str | bytes, token: str) -> Claim:
    """How the claim value ``held`` relates to ``token`` (both ``<copy>|<delivery>``)."""
    value = held.decode() if isinstance(held, bytes) else held
    if value == token:  # this delivery's own claim (a retried call whose reply was lost)
        return "new"
    return "mine" if value.split("|")[0] == token.split("|")[0] else "other"


def begin_on_redis(client: Any, *, claim_key: str, record_key: str, token: str,
                   claim_ttl_ms: int, started: str | None, record_ttl_ms: int | None,
                   attempt: int | None = None, rounds: tuple[int, int] = (0, 0),
                   lease_key: str | None = None, lease_ttl_ms: int = 0,
                   peek_key: str | None = None) -> AdmissionReply:
    """Claim ``claim_key`` for ``token`` and read ``record_key``, atomically.

    ``started`` (a record's JSON) is written when the claim is new and no record
    exists, or, with ``attempt`` (in ``rounds``: its replacement and replay rounds), when
    the stored one ranks below it (an earlier attempt or round):
    exactly when ``judge_delivery`` would say "run" and the adapter would write it.
    With ``lease_key``, the attempt's lease is taken for ``token`` first, in the same
    round trip (``ojs_adapters.runtime.leases``): a delivery's whole admission is one call.
    With a lease, ``peek_key``'s value comes back too (``AdmissionReply.peeked``).
    """
    keys, args = [claim_key, record_key], [token, claim_ttl_ms, started or "",
                                           record_ttl_ms or "", "" if attempt is None else attempt,
                                           *rounds]
    if lease_key is not None:
        keys.append(lease_key)
        args.extend([token, lease_ttl_ms])
        if peek_key is not None:
            keys.append(peek_key)
    claimed, held, record, wrote, leased, peeked = run_script(client, _ADMIT_LUA, keys, args)
    lease = None if lease_key is None else bool(leased)
    if lease is False:
        return AdmissionReply("other", None, False, False)
    if claimed:
        claim: Claim = "new"
    else:
        claim = "new" if held is None else claim_of(held, token)
    if not claimed and _text(held) == token and started and _text(record) == started:
        # This delivery's own claim and start, written by a call whose reply was lost:
        # as that call would have answered (else the start looks like a lost worker's).
        return AdmissionReply("new", None, True, lease, peeked)
    return AdmissionReply(claim, record, bool(wrote), lease, peeked)


def _text(raw: bytes | str | None) -> str | None:
    return raw.decode() if isinstance(raw, bytes) else raw
