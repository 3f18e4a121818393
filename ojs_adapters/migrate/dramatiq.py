"""Dramatiq actor retry options to an OJS RetryPolicy (no Dramatiq import: options are data).

Defaults are those of ``dramatiq.middleware.Retries``: ``max_retries`` 20 (21
attempts), ``min_backoff`` 15 000 ms, ``max_backoff`` 7 days (also the most
Dramatiq allows). The delay for retry count r (0-based) is, from Dramatiq 2.0,
``min_backoff * 2**r`` times a factor in [1, 2), past ``max_backoff``
``max_backoff`` times [0.5, 1); before 2.0, ``min(min_backoff * 2**r,
max_backoff)`` times [0.5, 1). ``throws`` errors fail at once; a failed
message goes to the broker's dead-letter queue, so ``on_exhaustion`` is
``dead_letter``. ``retry_when`` is code and replaces ``max_retries``: no
policy is proposed for it unless ``unbounded_attempts`` names a cap. The OJS
initial interval is ``min_backoff`` times the mean factor (1.5, or 0.75 before
2.0), so the expected delays match.

>>> m = from_dramatiq({"max_retries": 3, "min_backoff": 1000})
>>> (m.policy.max_attempts, m.policy.schedule(), m.policy.on_exhaustion)
(4, [1.5, 3.0, 6.0], 'dead_letter')
>>> from_dramatiq({"max_retries": 3, "min_backoff": 1000}, version="1.17").policy.schedule()
[0.75, 1.5, 3.0]
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ojs_adapters.migrate._common import (
    Notes,
    compared,
    get_int,
    get_names,
    iso_seconds,
    judged,
    normalize,
    note_ignored,
    parse_version,
    policy_from,
    positive_interval,
)
from ojs_adapters.migrate._fidelity import Band
from ojs_adapters.migrate._model import Migration

DIALECT = "dramatiq"
#: ``dramatiq.middleware.retries`` defaults, in milliseconds where Dramatiq uses them.
DEFAULT_MAX_RETRIES = 20
DEFAULT_MIN_BACKOFF_MS = 15_000
DEFAULT_MAX_BACKOFF_MS = 86_400_000 * 7
#: Dramatiq stops doubling after this exponent.
MAX_EXPONENT = 32
_KNOWN = {"max_retries", "min_backoff", "max_backoff", "retry_when", "throws",
          "on_retry_exhausted"}


#: The other options of ``@dramatiq.actor`` a file of actors may hold, and the value type
#: of each option an actor file is recognised by (``None``: ``max_retries`` unbounded).
_ACTOR_TYPES: dict[str, tuple[type, ...]] = {
    "max_retries": (int, type(None)), "min_backoff": (int, float), "max_backoff": (int, float),
    "throws": (str, list), "retry_when": (str,), "on_retry_exhausted": (str,),
    "actor_name": (str,), "name": (str,), "queue_name": (str,), "priority": (int,),
    "time_limit": (int, float), "max_age": (int, float), "store_results": (bool,),
    "result_ttl": (int, float), "on_success": (str,), "on_failure": (str,),
    "notify_shutdown": (bool,),
}
_ERROR_NAME = re.compile(r"[A-Za-z_][\w.]*")


def unlike_dramatiq(options: Mapping[Any, Any]) -> str | None:
    """Why ``options`` are not one actor's options as ``migrate --from dramatiq`` reads them
    (a directory scan passes such a file over); ``None`` when they are.

    Every key is an ``@dramatiq.actor`` option, of its type; ``throws`` names exception
    classes. An unrelated JSON document that happens to hold ``throws`` is not an actor.

    >>> unlike_dramatiq({"max_retries": 3, "throws": ["billing.CardDeclined"]}) is None
    True
    >>> unlike_dramatiq({"throws": True, "description": "may fail"})
    "key 'description' is not a Dramatiq actor option"
    """
    unknown = sorted(str(key) for key in options if str(key) not in _ACTOR_TYPES)
    if unknown:
        return f"key {unknown[0]!r} is not a Dramatiq actor option"
    for key, value in options.items():
        types = _ACTOR_TYPES[str(key)]
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            return f"{key!r} is {value!r}, not a Dramatiq {key} value"
    throws = options.get("throws")
    names = [throws] if isinstance(throws, str) else throws or []
    if not all(isinstance(n, str) and _ERROR_NAME.fullmatch(n) for n in names):
        return f"'throws' is {throws!r}, not exception class names"
    return None


def dramatiq_band(retries: int, *, min_ms: int, max_ms: int, before_2: bool = False) -> Band:
    """Dramatiq's delay in seconds before the retry after ``retries`` earlier ones
    (``before_2``: as Dramatiq 1.x draws it)."""
    raw = min_ms * 2 ** min(retries, MAX_EXPONENT)
    if before_2:  # [0.5, 1) x the capped delay
        capped = min(raw, max_ms)
        return Band(capped / 2000, capped / 1000, 0.75 * capped / 1000)
    if raw >= max_ms:  # the whole draw [raw, 2 raw) is over the cap: [0.5, 1) x max
        return Band(max_ms / 2000, max_ms / 1000, 0.75 * max_ms / 1000)
    if 2 * raw <= max_ms:
        return Band(raw / 1000, 2 * raw / 1000, 1.5 * raw / 1000)
    # Part of [raw, 2 raw) lies over the cap and is redrawn from [0.5, 1) x max.
    over = (2 * raw - max_ms) / raw
    mean = (1 - over) * (raw + max_ms) / 2 + over * 0.75 * max_ms
    return Band(min(raw, max_ms / 2) / 1000, max_ms / 1000, mean / 1000)


def from_dramatiq(options: Mapping[str, Any] | None, *, unbounded_attempts: int | None = None,
                  version: str | None = None, name: str | None = None,
                  origin: str | None = None) -> Migration:
    """Translate the options of one Dramatiq actor (as given to ``@dramatiq.actor``) for
    Dramatiq ``version`` (default: 2.x)."""
    opts = normalize(options, DIALECT)
    notes = Notes()
    if version is None:
        notes.add("info", "version", "Dramatiq version not given; assumed 2.x (its backoff "
                  "draws [1, 2) x the delay, 1.x's [0.5, 1) x; pass version to choose)")
    before_2 = version is not None and parse_version(version, DIALECT)[0] < 2
    note_ignored(opts, _KNOWN, notes)
    if opts.get("retry_when") is not None:
        return _capped(opts, notes, "retry_when", unbounded_attempts, name, origin, before_2,
                       f"{opts['retry_when']!s} is a predicate (code) that replaces max_retries "
                       "in Dramatiq; it was not evaluated")
    if "max_retries" in opts and opts["max_retries"] is None:
        return _capped(opts, notes, "max_retries", unbounded_attempts, name, origin, before_2,
                       "None: Dramatiq retries for ever; OJS max_attempts is an exact upper "
                       "bound (RET-01)")
    retries = get_int(opts, "max_retries", DIALECT, default=DEFAULT_MAX_RETRIES, minimum=0)
    assert retries is not None
    return _translate(opts, notes, retries, name, origin, before_2)


def _capped(opts: dict[str, Any], notes: Notes, key: str, cap: int | None, name: str | None,
            origin: str | None, before_2: bool, why: str) -> Migration:
    if cap is None:
        notes.add("unsupported", key, why + "; no policy is proposed. Choose a cap "
                  "(unbounded_attempts=, or --cap-unbounded N) to get one")
        return Migration(DIALECT, None, tuple(notes), name=name, origin=origin, options=opts)
    notes.add("lossy", key, why + f"; capped at {cap} attempts as asked", asked=True)
    return _translate(opts, notes, max(cap - 1, 0), name, origin, before_2)


def _translate(opts: dict[str, Any], notes: Notes, retries: int, name: str | None,
               origin: str | None, before_2: bool) -> Migration:
    min_ms = get_int(opts, "min_backoff", DIALECT, default=DEFAULT_MIN_BACKOFF_MS, minimum=0)
    max_ms = get_int(opts, "max_backoff", DIALECT, default=DEFAULT_MAX_BACKOFF_MS, minimum=0)
    assert min_ms is not None and max_ms is not None
    if max_ms > DEFAULT_MAX_BACKOFF_MS:
        notes.add("info", "max_backoff", f"{max_ms} ms: Dramatiq clamps it to 7 days")
        max_ms = DEFAULT_MAX_BACKOFF_MS
    throws = get_names(opts, "throws", DIALECT)
    if throws:
        notes.add("info", "throws", "became non_retryable_errors (a base-class name matches "
                  "subclasses, as Dramatiq's isinstance check does)")
    if opts.get("on_retry_exhausted"):
        notes.add("lossy", "on_retry_exhausted", "an actor to notify is not part of an OJS "
                  "policy; hook the adapter's dead-letter event instead")
    notes.add("info", None, "a failed Dramatiq message goes to the dead-letter queue: "
              "on_exhaustion 'dead_letter'")
    # Dramatiq's factor has mean 1.5 ([1, 2); 0.75 before 2.0), OJS jitter's 1: keep the mean.
    mean = 0.75 if before_2 else 1.5
    initial = positive_interval(min(mean * min_ms, max_ms) / 1000, "min_backoff", notes)
    policy = policy_from({
        "max_attempts": retries + 1, "on_exhaustion": "dead_letter",
        "non_retryable_errors": list(throws), "backoff_strategy": "exponential",
        "backoff_coefficient": 2.0, "jitter": True, "initial_interval": iso_seconds(initial),
        "max_interval": iso_seconds(max(max_ms / 1000, initial)),
    })
    if retries and before_2:
        notes.add("approximate", "min_backoff",
                  "Dramatiq 1.x multiplies the capped delay by [0.5, 1) (mean 0.75); OJS "
                  "multiplies by [0.5, 1.5) (mean 1) and caps at max_interval, so "
                  "initial_interval is 0.75 x min_backoff to keep the expected delays")
    elif retries:
        notes.add("approximate", "min_backoff",
                  "Dramatiq multiplies the delay by [1, 2) (mean 1.5) and redraws past "
                  "max_backoff from [0.5, 1) x max; OJS multiplies by [0.5, 1.5) (mean 1) and "
                  "caps at max_interval, so initial_interval is 1.5 x min_backoff to keep the "
                  "expected delays")
    old = [dramatiq_band(r, min_ms=min_ms, max_ms=max_ms, before_2=before_2)
           for r in range(compared(retries))]
    fidelity = judged(old, policy, notes)
    return Migration(DIALECT, policy, tuple(notes), fidelity, {}, name, origin, opts)
