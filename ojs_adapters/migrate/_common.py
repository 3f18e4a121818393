"""Helpers every dialect shares: reading option values, notes, intervals, fidelity.

Bad source values raise ``OjsValidationError`` (code ``INVALID_RETRY_POLICY``)
whose ``details`` name the ``dialect``, the ``field``, the ``value`` and the
``rule``, so the CLI reports them like any other OJS validation error.

>>> iso_seconds(90)
'PT1M30S'
>>> jitter_mean(capped=200.0, cap=250.0)  # the top of [100, 300) is cut at 250
193.75
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from ojs_adapters.backoff import JITTER_HIGH, JITTER_LOW
from ojs_adapters.durations import format_duration
from ojs_adapters.errors import OjsValidationError
from ojs_adapters.migrate._fidelity import (
    RETRY_TOLERANCE,
    SLACK_S,
    WINDOW_TOLERANCE,
    Band,
    Fidelity,
    FidelityRow,
    human_span,
)
from ojs_adapters.migrate._model import Note, Severity
from ojs_adapters.policy import RetryPolicy

#: Retries compared in a fidelity table (and fitted); enough for any real schedule.
MAX_COMPARED = 1000
#: The shortest interval we write when a source asks for "no delay": OJS
#: requires ``initial_interval`` > 0 (ojs-retry.md section 11.1).
MIN_INTERVAL_S = 0.001
#: The longest interval a translated policy uses (about 31 years; timedelta-safe).
MAX_INTERVAL_S = 10.0 ** 9


class Notes(list[Note]):
    """The notes of one translation as it is built (a local, never shared)."""

    def add(self, severity: Severity, field: str | None, text: str, *,
            asked: bool = False) -> None:
        """Append a note; ``asked`` when the caller chose the step (see ``Note``)."""
        self.append(Note(severity, field, text, asked))


def bad_option(dialect: str, field: str, value: Any, rule: str) -> OjsValidationError:
    """The error for a source value the dialect itself would not accept."""
    shown = value if value is None or isinstance(value, (bool, int, float, str)) else repr(value)
    return OjsValidationError(
        f"{dialect} option {field!r}: {rule} (got {value!r})",
        code="INVALID_RETRY_POLICY",
        details={"dialect": dialect, "field": field, "value": shown, "rule": rule},
    )


def normalize(options: Any, dialect: str) -> dict[str, Any]:
    """A plain dict of the options, keys as strings without a Ruby ``:`` prefix."""
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise bad_option(dialect, "<options>", options, "must be a mapping of option names")
    return {str(key).lstrip(":"): value for key, value in options.items()}


def get_int(opts: Mapping[str, Any], key: str, dialect: str, *, default: int | None = None,
            minimum: int | None = None) -> int | None:
    """An integer option (``true``/``false`` are not integers), or ``default``."""
    if key not in opts or opts[key] is None:
        return default
    value = opts[key]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_option(dialect, key, value, "must be an integer")
    if minimum is not None and value < minimum:
        raise bad_option(dialect, key, value, f"must be >= {minimum}")
    return value


def get_number(opts: Mapping[str, Any], key: str, dialect: str, *, default: float,
               minimum: float = 0.0) -> float:
    """A finite number option >= ``minimum``, or ``default`` when absent."""
    if key not in opts or opts[key] is None:
        return default
    value = opts[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value):
        raise bad_option(dialect, key, value, "must be a finite number")
    if value < minimum:
        raise bad_option(dialect, key, value, f"must be >= {minimum:g}")
    return float(value)


def get_bool(opts: Mapping[str, Any], key: str, dialect: str, *, default: bool) -> bool:
    """A boolean option, or ``default`` when absent."""
    if key not in opts or opts[key] is None:
        return default
    value = opts[key]
    if not isinstance(value, bool):
        raise bad_option(dialect, key, value, "must be true or false")
    return value


def get_names(opts: Mapping[str, Any], key: str, dialect: str) -> tuple[str, ...]:
    """A list of error type names (a single string counts as a list of one)."""
    value = opts.get(key)
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(
            isinstance(v, str) and v.strip() for v in value):
        raise bad_option(dialect, key, value, "must be a list of error type names")
    return tuple(v.strip() for v in value)


def parse_version(text: Any, dialect: str) -> tuple[int, int, int]:
    """``(major, minor, patch)`` of ``'8.1'``, ``'v7.3.9'`` or ``'6'``."""
    match = re.fullmatch(r"v?(\d+)(?:\.(\d+))?(?:\.(\d+))?", str(text).strip())
    if match is None:
        raise bad_option(dialect, "version", text, "must be a version such as '8.1' or '1.9.0'")
    major, minor, patch = (int(g) if g else 0 for g in match.groups())
    return major, minor, patch


def note_ignored(opts: Mapping[str, Any], known: Iterable[str], notes: Notes) -> None:
    """An ``info`` note naming options that have nothing to do with retries."""
    ignored = sorted(set(opts) - set(known))
    if ignored:
        notes.add("info", None, "not retry settings, left out: " + ", ".join(ignored))


def iso_seconds(seconds: float) -> str:
    """An ISO 8601 duration for ``seconds``, to the microsecond."""
    return format_duration(timedelta(seconds=seconds))


def positive_interval(seconds: float, field: str, notes: Notes) -> float:
    """``seconds`` within (0, ``MAX_INTERVAL_S``]; a note where the source is outside."""
    if seconds > MAX_INTERVAL_S:
        notes.add("lossy", field,
                  f"the source waits {seconds:g} s, longer than a retry policy can say; "
                  f"the policy waits {MAX_INTERVAL_S:g} s")
        return MAX_INTERVAL_S
    if seconds > 0:
        return seconds
    notes.add("approximate", field,
              "the source retries with no delay; OJS intervals must be > 0, "
              f"so the policy waits {MIN_INTERVAL_S * 1000:g} ms")
    return MIN_INTERVAL_S


def policy_from(fields: Mapping[str, Any]) -> RetryPolicy:
    """Validate the translated fields; a failure here is a bug in the dialect."""
    return RetryPolicy.from_dict(dict(fields))


def jitter_mean(*, capped: float, cap: float) -> float:
    """Expected value of ``min(capped * m, cap)`` for m uniform in [0.5, 1.5)."""
    if capped <= 0:
        return 0.0
    cut = cap / capped - JITTER_LOW  # the sample u above which the cap binds
    if cut >= 1.0:
        return capped
    if cut <= 0.0:
        return cap
    return capped * (JITTER_LOW * cut + cut * cut / 2) + cap * (1.0 - cut)


def policy_band(policy: RetryPolicy, retry: int) -> Band:
    """The OJS delay before ``retry`` as a band and its expected value."""
    capped = policy.capped_delay(retry)
    if not policy.jitter:
        return Band(capped, capped, capped)
    cap = policy.max_interval.total_seconds()
    return Band(capped * JITTER_LOW, min(capped * JITTER_HIGH, cap),
                jitter_mean(capped=capped, cap=cap))


def compared(retries: int) -> int:
    """How many of ``retries`` a dialect builds bands for (at most ``MAX_COMPARED``)."""
    return min(max(retries, 0), MAX_COMPARED)


def compare(old: Sequence[Band], policy: RetryPolicy) -> Fidelity:
    """Fidelity of ``policy`` against the source's bands (one per retry, first retry first)."""
    count = min(len(old), policy.max_retries, MAX_COMPARED)
    return Fidelity(tuple(FidelityRow(n, old[n - 1], policy_band(policy, n))
                          for n in range(1, count + 1)), policy.max_retries)


def judged(old: Sequence[Band], policy: RetryPolicy, notes: Notes) -> Fidelity:
    """``compare`` and a note with the verdict: ``approximate`` if faithful (and a note on
    ``hurried`` retries), else ``lossy``."""
    fidelity = compare(old, policy)
    worst = fidelity.worst
    if worst is None or fidelity.exact:
        return fidelity
    ratio = f" ({worst.ratio:.3g}x)" if math.isfinite(worst.ratio) else ""
    window = (f"total retry window {human_span(fidelity.old_total)} -> "
              f"{human_span(fidelity.new_total)}")
    if math.isfinite(fidelity.window_ratio):
        window += f" ({100 * (fidelity.window_ratio - 1):+.1f}%)"
    rule = (f"each retry and the whole window within {RETRY_TOLERANCE:g}x and "
            f"{WINDOW_TOLERANCE:g}x, or {SLACK_S:g} s")
    if fidelity.faithful:
        notes.add("approximate", None, f"expected delays differ most at retry {worst.retry}: "
                  f"{human_span(worst.new.mean)} where the source waits "
                  f"{human_span(worst.old.mean)}{ratio}; {window}; within tolerance "
                  f"({rule})")
        if fidelity.hurried:
            notes.add("approximate", None, fidelity.hurry() + ": under a minute off, yet "
                      "more load on a failing downstream early on than the source puts on it")
        return fidelity
    strays = fidelity.strays
    what = [window]
    if strays:
        first = strays[0]
        what.insert(0, f"{len(strays)} of {len(fidelity.rows)} retries off, first retry "
                    f"{first.retry}: {human_span(first.new.mean)} where the source waits "
                    f"{human_span(first.old.mean)}")
    notes.add("lossy", None, "the schedule is not kept: " + "; ".join(what)
              + f" (tolerance: {rule})")
    return fidelity


def fixed_band(seconds: float) -> Band:
    """A delay with no randomness."""
    return Band(seconds, seconds, seconds)


def full_jitter_band(ceiling: float) -> Band:
    """A delay drawn uniformly from [0, ceiling] ("full jitter")."""
    return Band(0.0, ceiling, ceiling / 2)
