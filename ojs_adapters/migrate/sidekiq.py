"""Sidekiq ``sidekiq_options`` to an OJS RetryPolicy.

Sidekiq counts *retries* (``retry: 25`` is 26 attempts) and overloads ``retry``:
``true`` is the default count, ``false`` means no retry *and* no dead set, and
``0`` means no retry but straight to the dead set. ``dead: false`` keeps
exhausted jobs out of the dead set. ``retry_for`` (7.1.3+) limits retries by
time; from 8.1 it replaces the count. ``sidekiq_retry_in`` may return seconds,
``:kill`` (to the dead set now) or ``:discard`` (dropped now, since 6.5.2).

Sidekiq's delay before retry ``count`` (0-based) is ``count**4 + 15`` plus a
random term that changed twice (``SIDEKIQ_JITTER``). The OJS policy chosen is
polynomial, fitted so the worst per-retry ratio of expected delays is as small
as it can be; ``Migration.fidelity`` reports it.

>>> m = from_sidekiq({"retry": 0})
>>> (m.policy.max_attempts, m.policy.on_exhaustion)
(1, 'dead_letter')
>>> from_sidekiq({"retry": False}).policy.on_exhaustion
'discard'
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ojs_adapters.durations import parse_duration
from ojs_adapters.errors import OjsValidationError
from ojs_adapters.failure import HandlerCode
from ojs_adapters.migrate._common import (
    Notes,
    bad_option,
    compare,
    compared,
    fixed_band,
    get_bool,
    get_int,
    iso_seconds,
    normalize,
    note_ignored,
    parse_version,
    policy_from,
)
from ojs_adapters.migrate._fit import polynomial_fields
from ojs_adapters.migrate._model import Band, Migration
from ojs_adapters.migrate._ruby import DURATION_UNITS, Dynamic

DIALECT = "sidekiq"
#: The version assumed when none is given.
LATEST = "8.1"
#: Retries for ``retry: true`` unless ``max_retries`` says otherwise.
DEFAULT_RETRIES = 25
#: The random term of the delay, newest first: (first version, spread, scaled).
#: ``scaled`` draws ``rand(spread * (count + 1))``; otherwise ``rand(spread) * (count + 1)``.
SIDEKIQ_JITTER: tuple[tuple[tuple[int, int, int], int, bool], ...] = (
    ((8, 0, 0), 10, True),     # 8.x: rand(10 * (count + 1))
    ((6, 2, 2), 10, False),    # 6.2.2 to 7.x: rand(10) * (count + 1)
    ((0, 0, 0), 30, False),    # up to 6.2.1: rand(30) * (count + 1)
)
RETRY_FOR_SINCE = (7, 1, 3)
RETRY_FOR_WINS_SINCE = (8, 1, 0)
RESULT_SYMBOLS_SINCE = (6, 5, 2)

_KNOWN = {"retry", "dead", "retry_for", "sidekiq_retry_in", "retry_in", "max_retries"}
Action = Literal["kill", "discard"]


@dataclass(frozen=True)
class _RetryIn:
    """What ``sidekiq_retry_in`` returns: one answer for all errors and per-error ones."""

    seconds: float | None = None
    action: Action | None = None
    per_error: dict[str, float | Action] = field(default_factory=dict, hash=False)


def from_sidekiq(options: Mapping[str, Any] | None, *, version: str | None = None,
                 name: str | None = None, origin: str | None = None) -> Migration:
    """Translate Sidekiq job options for Sidekiq ``version`` (default: the latest, 8.1).

    >>> m = from_sidekiq({"retry": 5, "dead": False}, version="7.3")
    >>> (m.policy.max_attempts, m.policy.on_exhaustion, m.policy.backoff_strategy)
    (6, 'discard', 'polynomial')
    """
    opts = normalize(options, DIALECT)
    notes = Notes()
    ver = _version(version, notes)
    note_ignored(opts, _KNOWN, notes)
    dynamic = [k for k in ("retry", "dead", "retry_for", "max_retries")
               if isinstance(opts.get(k), Dynamic)]
    if dynamic:
        for key in dynamic:
            notes.add("unsupported", key, f"{opts[key]} is not a literal; it was not evaluated, "
                      "so no policy is proposed (write the value, or translate by hand)")
        return Migration(DIALECT, None, tuple(notes), name=name, origin=origin, options=opts)

    dead = get_bool(opts, "dead", DIALECT, default=True)
    exhaust: Literal["dead_letter", "discard"] = "dead_letter" if dead else "discard"
    retry_in = _retry_in(opts, ver, notes)
    by_time = opts.get("retry_for") is not None and ver >= RETRY_FOR_WINS_SINCE
    retries = _retries(opts, exhaust, notes, quiet=by_time)
    if retries is None:  # retry: false
        if opts.get("retry_for") is not None:
            notes.add("info", "retry_for", "no effect with retry: false")
        return _finish(opts, notes, 0, "discard", retry_in, ver, name, origin)
    retries = _apply_retry_for(opts, ver, retries, retry_in, notes)
    if retry_in.action is not None:
        kept = "dead_letter" if retry_in.action == "kill" and dead else "discard"
        notes.add("info", "sidekiq_retry_in",
                  f":{retry_in.action} for every error: the job ends at its first failure "
                  + ("in the dead set" if kept == "dead_letter" else "and is dropped"))
        return _finish(opts, notes, 0, kept, retry_in, ver, name, origin)
    return _finish(opts, notes, retries, exhaust, retry_in, ver, name, origin)


def sidekiq_band(count: int, ver: tuple[int, int, int], *, base: float | None = None) -> Band:
    """Sidekiq's delay before retry ``count`` (0-based): base plus its random term."""
    base = count ** 4 + 15 if base is None else base
    spread, scaled = next((s, k) for since, s, k in SIDEKIQ_JITTER if ver >= since)
    top = spread * (count + 1) - 1 if scaled else (spread - 1) * (count + 1)
    return Band(base, base + top, base + top / 2)


def _finish(opts: dict[str, Any], notes: Notes, retries: int, exhaust: str, retry_in: _RetryIn,
            ver: tuple[int, int, int], name: str | None, origin: str | None) -> Migration:
    non_retryable: list[str] = []
    codes: dict[str, HandlerCode] = {}
    if retries == 0 and retry_in.per_error:
        notes.add("info", "sidekiq_retry_in", "per-error answers are never asked for: with no "
                  "retries the job ends at its first failure")
    for error, answer in retry_in.per_error.items() if retries else ():
        if isinstance(answer, float):
            notes.add("lossy", "sidekiq_retry_in", f"{answer:g} s for {error} only: an OJS "
                      "policy has one schedule for all errors, so this delay is not kept")
            continue
        ends = "dead_letter" if answer == "kill" and exhaust == "dead_letter" else "discard"
        if ends == exhaust:
            non_retryable.append(error)
        else:
            codes[error] = "DEAD_LETTER" if ends == "dead_letter" else "DISCARD"
            notes.add("approximate", "sidekiq_retry_in",
                      f":{answer} for {error}: the handler must raise "
                      f"JobError({error!r}, code={codes[error]!r}); the policy alone sends "
                      f"non-retryable errors to on_exhaustion={exhaust!r}")
    fields: dict[str, Any] = {"max_attempts": retries + 1, "on_exhaustion": exhaust,
                              "non_retryable_errors": non_retryable}
    old: list[Band] = []
    if retries and retry_in.seconds is not None:
        jitter = ver >= RESULT_SYMBOLS_SINCE
        old = [sidekiq_band(c, ver, base=retry_in.seconds) if jitter
               else fixed_band(retry_in.seconds) for c in range(compared(retries))]
        fields.update(backoff_strategy="none", jitter=False,
                      initial_interval=iso_seconds(retry_in.seconds),
                      max_interval=iso_seconds(retry_in.seconds))
        if jitter:
            notes.add("approximate", "sidekiq_retry_in",
                      "Sidekiq adds its random term to the fixed delay; the OJS policy "
                      "waits the fixed delay exactly (jitter off)")
    elif retries:
        old = [sidekiq_band(c, ver) for c in range(compared(retries))]
        shape, why = polynomial_fields([b.mean for b in old], retries)
        fields.update(shape)
        notes.add("approximate", "retry", "Sidekiq's delay " + why)
        notes.add("approximate", "retry",
                  "Sidekiq's random term is added seconds; OJS jitter multiplies the delay by "
                  "[0.5, 1.5), a wider spread in absolute terms")
    policy = policy_from(fields)
    return Migration(DIALECT, policy, tuple(notes), compare(old, policy), codes, name, origin,
                     opts)


def _version(version: str | None, notes: Notes) -> tuple[int, int, int]:
    if version is None:
        notes.add("info", "version", f"Sidekiq version not given; assumed {LATEST} "
                  "(the delay formula and retry_for rules depend on it)")
        version = LATEST
    return parse_version(version, DIALECT)


def _retries(opts: dict[str, Any], exhaust: str, notes: Notes, *, quiet: bool) -> int | None:
    """The retry count, or ``None`` for ``retry: false``; ``quiet`` when retry_for replaces it."""
    default = get_int(opts, "max_retries", DIALECT, default=DEFAULT_RETRIES, minimum=0)
    assert default is not None
    value = opts.get("retry")
    if value is None or value is True:
        if value is None and not quiet:
            notes.add("info", "retry", f"not set: Sidekiq's default of {default} retries "
                      f"({default + 1} attempts)")
        return default
    if value is False:
        notes.add("info", "retry", "false: no retry, and the failed job is not kept in the dead "
                  "set, so the policy discards it whatever 'dead' says")
        return None
    count = get_int(opts, "retry", DIALECT)
    assert count is not None
    if count <= 0 and not quiet:
        place = "goes to the dead set at once" if exhaust == "dead_letter" else "is dropped"
        notes.add("info", "retry", f"{count}: no retry; the failed job {place}")
    return max(count, 0)


def _apply_retry_for(opts: dict[str, Any], ver: tuple[int, int, int], retries: int,
                     retry_in: _RetryIn, notes: Notes) -> int:
    if opts.get("retry_for") is None:
        return retries
    window = _seconds(opts["retry_for"], "retry_for")
    if ver < RETRY_FOR_SINCE:
        notes.add("lossy", "retry_for", "Sidekiq before 7.1.3 ignores retry_for; so does the "
                  "policy")
        return retries
    bands = [sidekiq_band(c, ver, base=retry_in.seconds) for c in range(10_000)]
    fit = {key: _fit_window(bands, window, key) for key in ("mean", "low", "high")}
    counted = fit["mean"]
    spread = (f" (between {fit['high']} and {fit['low']} depending on Sidekiq's random term)"
              if fit["high"] != fit["low"] else "")
    if ver >= RETRY_FOR_WINS_SINCE:
        if "retry" in opts and opts["retry"] is not True:
            notes.add("info", "retry", "since Sidekiq 8.1 retry_for wins: the retry count is "
                      "ignored")
        result = counted
    else:
        result = min(retries, counted)
    notes.add("approximate", "retry_for",
              f"OJS limits attempts, not time: a window of {iso_seconds(window)} holds "
              f"{counted} retries of the expected Sidekiq schedule{spread}"
              + ("" if result == counted else f"; the retry count {retries} ends it first"))
    return result


def _fit_window(bands: list[Band], window: float, key: str) -> int:
    """Retries Sidekiq makes before ``failed_at + retry_for`` passes (at least one)."""
    elapsed, retries = 0.0, 0
    for band in bands:
        if elapsed > window:
            break
        retries += 1
        elapsed += getattr(band, key)
    return retries


def _retry_in(opts: dict[str, Any], ver: tuple[int, int, int], notes: Notes) -> _RetryIn:
    value = opts.get("sidekiq_retry_in", opts.get("retry_in"))
    if value is None:
        return _RetryIn()
    if isinstance(value, Dynamic):
        notes.add("unsupported", "sidekiq_retry_in",
                  f"a {value}: code, not evaluated; the schedule assumes Sidekiq's default "
                  "formula (what Sidekiq uses when the block returns nil)")
        return _RetryIn()
    if isinstance(value, Mapping):
        per_error: dict[str, float | Action] = {}
        default = _RetryIn()
        for key, answer in value.items():
            parsed = _answer(answer, ver, notes)
            if str(key) in ("*", "default", "else"):
                default = parsed
            elif parsed.action is not None:
                per_error[str(key)] = parsed.action
            elif parsed.seconds is not None:
                per_error[str(key)] = parsed.seconds
        return _RetryIn(default.seconds, default.action, per_error)
    return _answer(value, ver, notes)


def _answer(value: Any, ver: tuple[int, int, int], notes: Notes) -> _RetryIn:
    if isinstance(value, str) and value.lstrip(":") in ("kill", "discard"):
        if ver < RESULT_SYMBOLS_SINCE:
            notes.add("lossy", "sidekiq_retry_in", f"{value}: Sidekiq before 6.5.2 does not "
                      "understand it and uses the default delay; so does the policy")
            return _RetryIn()
        action: Action = "kill" if value.lstrip(":") == "kill" else "discard"
        return _RetryIn(action=action)
    seconds = _seconds(value, "sidekiq_retry_in")
    if seconds <= 0:
        notes.add("info", "sidekiq_retry_in", f"{value}: not a positive delay, so Sidekiq uses "
                  "its default formula")
        return _RetryIn()
    return _RetryIn(seconds=seconds)


def _seconds(value: Any, key: str) -> float:
    """Seconds from a number, ``'3.days'`` or an ISO 8601 duration."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        match = re.fullmatch(r"(\d+(?:\.\d+)?)\.(\w+)", text)
        if match and match.group(2) in DURATION_UNITS:
            return float(match.group(1)) * DURATION_UNITS[match.group(2)]
        if text.startswith("P"):
            try:
                return parse_duration(text, field=key).total_seconds()
            except OjsValidationError:
                pass
    raise bad_option(DIALECT, key, value, "must be seconds, a duration such as '3.days', "
                     "or an ISO 8601 duration")
