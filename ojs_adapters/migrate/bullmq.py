"""BullMQ job options (``attempts``, ``backoff``) to an OJS RetryPolicy.

``attempts`` counts every run, as OJS ``max_attempts`` does; the default is 1
(no retry). ``backoff`` is a number of milliseconds (fixed) or
``{type: 'fixed'|'exponential', delay, jitter}``; exponential waits
``delay * 2**(attemptsMade - 1)``, and ``jitter`` j draws from
[delay * (1 - j), delay). Without ``backoff`` a job is retried at once. A job
that runs out of attempts stays in the failed set unless ``removeOnFail`` is
true, so ``on_exhaustion`` is ``dead_letter`` by default.

>>> m = from_bullmq({"attempts": 4, "backoff": {"type": "exponential", "delay": 1000}})
>>> (m.policy.max_attempts, m.policy.schedule(), m.exact)
(4, [1.0, 2.0, 4.0], True)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ojs_adapters.migrate._common import (
    Notes,
    bad_option,
    compared,
    get_int,
    get_number,
    iso_seconds,
    judged,
    normalize,
    note_ignored,
    policy_from,
    positive_interval,
)
from ojs_adapters.migrate._fidelity import Band
from ojs_adapters.migrate._fit import LONGEST_CAP_S
from ojs_adapters.migrate._model import Migration

DIALECT = "bullmq"
#: ``attempts`` when not given.
DEFAULT_ATTEMPTS = 1
_KNOWN = {"attempts", "backoff", "removeOnFail"}


def from_bullmq(options: Mapping[str, Any] | None, *, name: str | None = None,
                origin: str | None = None) -> Migration:
    """Translate the options of one BullMQ job (``queue.add(name, data, options)``)."""
    opts = normalize(options, DIALECT)
    notes = Notes()
    note_ignored(opts, _KNOWN, notes)
    attempts = get_int(opts, "attempts", DIALECT, default=DEFAULT_ATTEMPTS, minimum=0)
    assert attempts is not None
    if "attempts" not in opts:
        notes.add("info", "attempts", "not set: BullMQ runs a job once (attempts 1)")
    exhaust = _exhaustion(opts.get("removeOnFail"), notes)
    parsed = _backoff(opts.get("backoff"), attempts, notes)
    if parsed is None:
        return Migration(DIALECT, None, tuple(notes), name=name, origin=origin, options=opts)
    kind, delay_ms, jitter = parsed
    wait = delay_ms / 1000 * (1 - jitter / 2)  # the expected delay under BullMQ's jitter
    delay = positive_interval(wait, "backoff.delay", notes) if attempts > 1 \
        else min(max(wait, 0.001), LONGEST_CAP_S)
    retries = max(attempts - 1, 0)
    grow = kind == "exponential"
    top = delay * 2 ** min(max(retries - 1, 0), 1000) if grow else delay
    policy = policy_from({
        "max_attempts": attempts, "on_exhaustion": exhaust,
        "backoff_strategy": "exponential" if grow else "none", "backoff_coefficient": 2.0,
        "jitter": False, "initial_interval": iso_seconds(delay),
        "max_interval": iso_seconds(min(top, LONGEST_CAP_S)),
    })
    if grow and retries > 1:
        notes.add("info", "backoff", "BullMQ has no delay cap; " + (
            "max_interval is the last retry's delay so it never binds" if top <= LONGEST_CAP_S
            else f"max_interval is the longest written (about 31 years) and binds from retry "
                 f"{math.floor(math.log2(LONGEST_CAP_S / delay)) + 2}"))
    if jitter:
        notes.add("approximate", "backoff.jitter",
                  f"BullMQ draws from [{1 - jitter:g}, 1) x delay; OJS jitter would draw from "
                  "[0.5, 1.5), so the policy keeps jitter off and waits the expected delay, "
                  f"{1 - jitter / 2:g} x delay")
    old = [_band(delay_ms / 1000 * (2 ** min(n - 1, 1000) if grow else 1), jitter)
           for n in range(1, compared(retries) + 1)]
    fidelity = judged(old, policy, notes)
    return Migration(DIALECT, policy, tuple(notes), fidelity, {}, name, origin, opts)


def _band(seconds: float, jitter: float) -> Band:
    low = seconds * (1 - jitter)
    return Band(low, seconds, (low + seconds) / 2)


def _backoff(value: Any, attempts: int, notes: Notes) -> tuple[str, float, float] | None:
    if value is None:
        if attempts > 1:
            notes.add("info", "backoff", "not set: BullMQ retries at once")
        return "fixed", 0.0, 0.0
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = {"type": "fixed", "delay": value}
    if not isinstance(value, Mapping):
        raise bad_option(DIALECT, "backoff", value, "must be milliseconds or {type, delay}")
    kind = value.get("type")
    if not isinstance(kind, str) or not kind:
        raise bad_option(DIALECT, "backoff.type", kind, "must be 'fixed', 'exponential' or the "
                         "name of a custom strategy")
    if kind not in ("fixed", "exponential"):
        notes.add("unsupported", "backoff.type", f"{kind!r} is a custom strategy (code); it was "
                  "not evaluated, so no policy is proposed")
        return None
    delay = get_number(dict(value), "delay", DIALECT, default=0.0)
    jitter = get_number(dict(value), "jitter", DIALECT, default=0.0)
    if jitter > 1:
        raise bad_option(DIALECT, "backoff.jitter", jitter, "must be between 0 and 1")
    return str(kind), delay, jitter


def _exhaustion(remove: Any, notes: Notes) -> str:
    if remove is True:
        notes.add("info", "removeOnFail", "true: failed jobs are deleted: on_exhaustion "
                  "'discard'")
        return "discard"
    if remove not in (None, False):
        notes.add("approximate", "removeOnFail", f"{remove!r}: failed jobs are kept for a while "
                  "only; on_exhaustion 'dead_letter' (retention is the dead-letter store's "
                  "business)")
    else:
        notes.add("info", "removeOnFail", "failed jobs stay in BullMQ's failed set: "
                  "on_exhaustion 'dead_letter'")
    return "dead_letter"
