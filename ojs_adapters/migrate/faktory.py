"""Faktory's overloaded ``retry`` field to an OJS RetryPolicy.

``retry: N`` (N > 0) retries N times, then the job goes to the Dead set (the
morgue); ``0`` means one attempt and the job is discarded; ``-1`` means one
attempt and straight to the morgue. A payload *without* ``retry`` gets the
default of 25 on Faktory 1.6.0 and later (faktory#385 made the field a
pointer), but unmarshals to 0 (discarded) on earlier servers (faktory#144).
The delay is ``count**4 + 15 + rand(30) * (count + 1)`` seconds, count from 0:
Sidekiq's old formula, so it gets the same fit (``_sidekiq_delay.offset_formula``).

>>> [from_faktory({"retry": r}).policy.on_exhaustion for r in (25, 0, -1)]
['dead_letter', 'discard', 'dead_letter']
>>> from_faktory({}, version="1.5").policy.on_exhaustion
'discard'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ojs_adapters.migrate._common import (
    Notes,
    bad_option,
    compared,
    get_int,
    judged,
    normalize,
    note_ignored,
    parse_version,
    policy_from,
)
from ojs_adapters.migrate._fidelity import Band
from ojs_adapters.migrate._model import Migration
from ojs_adapters.migrate._sidekiq_delay import offset_formula

DIALECT = "faktory"
#: Retries when the payload has no ``retry`` (client libraries and servers >= 1.6.0).
DEFAULT_RETRIES = 25
#: First server version that reads a missing ``retry`` as the default, not 0.
POINTER_RETRY_SINCE = (1, 6, 0)
_KNOWN = {"retry"}


def faktory_band(count: int) -> Band:
    """Faktory's delay before retry ``count`` (0-based): ``count**4 + 15 + rand(30)*(count+1)``."""
    base = count ** 4 + 15
    return Band(base, base + 29 * (count + 1), base + 14.5 * (count + 1))


def from_faktory(options: Mapping[str, Any] | None, *, version: str | None = None,
                 name: str | None = None, origin: str | None = None) -> Migration:
    """Translate a Faktory job payload (or worker options) for server ``version``.

    >>> m = from_faktory({"retry": 5})
    >>> (m.policy.max_attempts, m.policy.backoff_strategy)
    (6, 'exponential')
    """
    opts = normalize(options, DIALECT)
    notes = Notes()
    note_ignored(opts, _KNOWN | {"jid", "jobtype", "args", "queue", "custom", "at",
                                 "reserve_for", "priority", "backtrace"}, notes)
    retries = _retries(opts, version, notes)
    if retries == 0 or retries == -1:
        exhaust = "discard" if retries == 0 else "dead_letter"
        policy = policy_from({"max_attempts": 1, "on_exhaustion": exhaust})
        fidelity = judged([], policy, notes)
        return Migration(DIALECT, policy, tuple(notes), fidelity, {}, name, origin, opts)
    old = [faktory_band(c) for c in range(compared(retries))]
    shape, why = offset_formula(old, retries, "Faktory")
    policy = policy_from({"max_attempts": retries + 1, "on_exhaustion": "dead_letter", **shape})
    notes.add("approximate", "retry", "Faktory's delay " + why)
    notes.add("info", "retry", "exhausted jobs go to Faktory's Dead set: on_exhaustion "
              "'dead_letter'")
    fidelity = judged(old, policy, notes)
    return Migration(DIALECT, policy, tuple(notes), fidelity, {}, name, origin, opts)


def _retries(opts: dict[str, Any], version: str | None, notes: Notes) -> int:
    if "retry" in opts and opts["retry"] is not None:
        value = get_int(opts, "retry", DIALECT)
        assert value is not None
        if value < -1:
            raise bad_option(DIALECT, "retry", value, "must be -1, 0 or a positive count")
        if value == 0:
            notes.add("info", "retry", "0: one attempt; a failed job is discarded, not kept")
        elif value == -1:
            notes.add("info", "retry", "-1: one attempt; a failed job goes straight to the "
                      "Dead set")
        return value
    if version is not None and parse_version(version, DIALECT) < POINTER_RETRY_SINCE:
        notes.add("info", "retry", f"missing: Faktory {version} reads it as 0, so a failed job "
                  "is discarded after one attempt")
        return 0
    notes.add("info", "retry", f"missing: Faktory 1.6.0+ applies the default of "
              f"{DEFAULT_RETRIES} retries (servers before 1.6.0 read it as 0 and discard; "
              "pass version= to choose)")
    return DEFAULT_RETRIES
