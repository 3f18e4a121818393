"""A Temporal RetryPolicy to an OJS RetryPolicy: the closest dialect, OJS's model.

Temporal fields are camelCase (``initialInterval``, ``backoffCoefficient``,
``maximumInterval``, ``maximumAttempts``, ``nonRetryableErrorTypes``); the
snake_case spelling of the Python SDK is accepted too. Defaults: 1 s, 2.0,
100 x ``initialInterval``, and ``maximumAttempts`` 0, which means *unlimited*
and has no OJS equivalent (reported; no policy unless ``unbounded_attempts``
names a cap). Temporal does not jitter retries, so the policy has jitter off
and the schedule is exact. An activity's ``scheduleToCloseTimeout`` also ends
its retries (a time limit over all attempts); a policy limits attempts only,
so it is reported as lossy.

>>> m = from_temporal({"initialInterval": "2s", "maximumAttempts": 4,
...                    "nonRetryableErrorTypes": ["CardStolen"]})
>>> (m.policy.schedule(), m.policy.non_retryable_errors, m.fidelity.exact)
([2.0, 4.0, 8.0], ('CardStolen',), True)
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ojs_adapters.durations import parse_duration
from ojs_adapters.errors import OjsValidationError
from ojs_adapters.migrate._common import (
    Notes,
    bad_option,
    compared,
    fixed_band,
    get_int,
    get_names,
    get_number,
    iso_seconds,
    judged,
    normalize,
    note_ignored,
    policy_from,
)
from ojs_adapters.migrate._model import Migration

DIALECT = "temporal"
#: Temporal's defaults (``maximumInterval`` is 100 x ``initialInterval``).
DEFAULT_INITIAL_S = 1.0
DEFAULT_COEFFICIENT = 2.0
DEFAULT_MAX_FACTOR = 100
#: snake_case spellings (Python SDK) to the camelCase of the API.
_ALIASES = {"initial_interval": "initialInterval", "backoff_coefficient": "backoffCoefficient",
            "maximum_interval": "maximumInterval", "maximum_attempts": "maximumAttempts",
            "non_retryable_error_types": "nonRetryableErrorTypes",
            "schedule_to_close_timeout": "scheduleToCloseTimeout"}
#: Units of Go (``1m30s``), protobuf JSON (``1.5s``) and the TypeScript ``ms`` package.
_UNITS = {"ms": 0.001, "millisecond": 0.001, "milliseconds": 0.001, "s": 1.0, "sec": 1.0,
          "second": 1.0, "seconds": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0,
          "minutes": 60.0, "h": 3600.0, "hour": 3600.0, "hours": 3600.0, "d": 86400.0,
          "day": 86400.0, "days": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]+)")


def from_temporal(options: Mapping[str, Any] | None, *, unbounded_attempts: int | None = None,
                  name: str | None = None, origin: str | None = None) -> Migration:
    """Translate one Temporal RetryPolicy (JSON of the API, or the SDKs' field names)."""
    opts = {_ALIASES.get(k, k): v for k, v in normalize(options, DIALECT).items()}
    notes = Notes()
    note_ignored(opts, set(_ALIASES.values()), notes)
    initial = _duration(opts, "initialInterval", DEFAULT_INITIAL_S, notes)
    if initial <= 0:
        raise bad_option(DIALECT, "initialInterval", opts.get("initialInterval"),
                         "must be greater than zero")
    maximum = _duration(opts, "maximumInterval", DEFAULT_MAX_FACTOR * initial, notes)
    if maximum < initial:
        raise bad_option(DIALECT, "maximumInterval", opts.get("maximumInterval"),
                         "must be >= initialInterval")
    coefficient = get_number(opts, "backoffCoefficient", DIALECT, default=DEFAULT_COEFFICIENT,
                             minimum=1.0)
    attempts = get_int(opts, "maximumAttempts", DIALECT, default=0, minimum=0)
    assert attempts is not None
    if attempts == 0:
        if unbounded_attempts is None:
            notes.add("unsupported", "maximumAttempts", "0 (or unset): Temporal retries without "
                      "limit; OJS max_attempts is an exact upper bound (RET-01), so no policy "
                      "is proposed. Choose a cap (unbounded_attempts=, or --cap-unbounded N)")
            return Migration(DIALECT, None, tuple(notes), name=name, origin=origin, options=opts)
        notes.add("lossy", "maximumAttempts", f"0: Temporal retries without limit; capped at "
                  f"{unbounded_attempts} attempts as asked", asked=True)
        attempts = unbounded_attempts
    if opts.get("scheduleToCloseTimeout") is not None:
        limit = iso_seconds(_duration(opts, "scheduleToCloseTimeout", 0.0, notes))
        notes.add("lossy", "scheduleToCloseTimeout", f"{limit}: Temporal stops retrying once "
                  "this much time has passed since the first attempt was scheduled; an OJS "
                  "policy limits attempts, not time, so the limit is not kept (the opt-in "
                  f"extension max_duration: {limit} can hold it, if you opt in)")
    notes.add("info", None, "Temporal does not jitter retry intervals; the policy has jitter "
              "off so the schedule is the same")
    notes.add("approximate", None, "an exhausted Temporal activity fails into its workflow, "
              "which keeps the history; the nearest OJS outcome is on_exhaustion 'dead_letter'")
    policy = policy_from({
        "max_attempts": attempts, "initial_interval": iso_seconds(initial),
        "max_interval": iso_seconds(maximum), "backoff_coefficient": coefficient,
        "backoff_strategy": "exponential", "jitter": False, "on_exhaustion": "dead_letter",
        "non_retryable_errors": list(get_names(opts, "nonRetryableErrorTypes", DIALECT)),
    })
    old = [fixed_band(policy.capped_delay(n)) for n in range(1, compared(policy.max_retries) + 1)]
    fidelity = judged(old, policy, notes)
    return Migration(DIALECT, policy, tuple(notes), fidelity, {}, name, origin, opts)


def _duration(opts: dict[str, Any], key: str, default: float, notes: Notes) -> float:
    value = opts.get(key)
    if value is None:
        return default
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        notes.add("info", key, f"{value}: a bare number is read as milliseconds, as the "
                  "TypeScript SDK does")
        return float(value) / 1000
    if isinstance(value, str):
        text = value.strip().lower()
        if text.startswith("p"):
            try:
                return parse_duration(value.strip(), field=key).total_seconds()
            except OjsValidationError:
                pass
        parts = _PART.findall(text)
        if parts and _PART.sub("", text).strip() == "" and all(u in _UNITS for _, u in parts):
            return sum(float(n) * _UNITS[u] for n, u in parts)
    raise bad_option(DIALECT, key, value, "must be a duration such as '1s', '1m30s', "
                     "'PT1S' or milliseconds")
