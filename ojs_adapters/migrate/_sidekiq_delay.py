"""Sidekiq's retry delay: its default formula and what ``sidekiq_retry_in`` returns.

The delay before retry ``count`` (0-based) is ``count**4 + 15`` plus a random
term that changed twice (``SIDEKIQ_JITTER``), unless ``sidekiq_retry_in``
gives a positive number of seconds (Sidekiq calls ``to_i`` on it), ``:kill``
(to the dead set now) or ``:discard`` (dropped now, both since 6.5.2). Since
6.2.2 the random term is added to a custom delay too. An answer is read from YAML or
JSON (``30``, ``'3.days'``, ``'30 * (count + 1)'``, ``':kill'``, or a mapping
of error class names to answers, ``'*'`` for the rest) or from a Ruby block
``_ruby_block`` could read. ``offset_formula`` fits the default formula (Faktory's too).

>>> read_retry_in({"Stripe::CardError": ":kill", "*": "30 * (count + 1)"}, (8, 1, 0),
...               []).per_error
{'Stripe::CardError': 'kill'}
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ojs_adapters.durations import parse_duration
from ojs_adapters.errors import OjsValidationError
from ojs_adapters.migrate._arith import DURATION_UNITS, Formula, FormulaError, parse_formula
from ojs_adapters.migrate._common import bad_option
from ojs_adapters.migrate._fidelity import Band
from ojs_adapters.migrate._fit import cap_words, fit_schedule, fit_shape, schedule_fields
from ojs_adapters.migrate._model import Note
from ojs_adapters.migrate._ruby_literals import Dynamic

DIALECT = "sidekiq"
#: The random term of the delay, newest first: (first version, spread, scaled).
#: ``scaled`` draws ``rand(spread * (count + 1))``; otherwise ``rand(spread) * (count + 1)``.
SIDEKIQ_JITTER: tuple[tuple[tuple[int, int, int], int, bool], ...] = (
    ((8, 0, 0), 10, True),     # 8.x: rand(10 * (count + 1))
    ((6, 2, 2), 10, False),    # 6.2.2 to 7.x: rand(10) * (count + 1)
    ((0, 0, 0), 30, False),    # up to 6.2.1: rand(30) * (count + 1)
)
#: ojs-retry section 3.4: the coefficient for Sidekiq's ``count**4`` (Faktory's too).
SPEC_COEFFICIENT = 4.0
#: First version that understands ``:kill``/``:discard`` from ``sidekiq_retry_in``.
RESULT_SYMBOLS_SINCE = (6, 5, 2)
#: First version that adds its random term to a custom delay (Changes.md 6.2.2, #4957).
BLOCK_JITTER_SINCE = (6, 2, 2)
#: The longest delay modelled (about 31 million years): keeps every figure finite.
_LONGEST_S = 1e15
#: The longest duration an option may give (about 31,700 years; a timedelta holds 2.7 million).
_LONGEST_SPAN_S = 1e12
Version = tuple[int, int, int]
Action = Literal["kill", "discard"]
#: One answer of the block: a delay formula, an action, or ``None`` (Sidekiq's default).
Answer = Formula | Action | None
_DEFAULT_KEYS = ("*", "default", "else")


@dataclass(frozen=True)
class RetryIn:
    """What ``sidekiq_retry_in`` returns: one answer for most errors, and per-error ones."""

    default: Answer = None
    per_error: dict[str, Answer] = field(default_factory=dict, hash=False)


def sidekiq_band(count: int, ver: Version, *, base: float | None = None) -> Band:
    """Sidekiq's delay before retry ``count`` (0-based): base plus its random term."""
    base = count ** 4 + 15 if base is None else base
    spread, scaled = next((s, k) for since, s, k in SIDEKIQ_JITTER if ver >= since)
    top = spread * (count + 1) - 1 if scaled else (spread - 1) * (count + 1)
    return Band(base, base + top, base + top / 2)


def random_term(ver: Version) -> tuple[str, str]:
    """Sidekiq's random term for ``ver`` as Ruby, and its mean in seconds.

    >>> random_term((8, 1, 0))
    ('rand(10 * (count + 1))', '5 * (count + 1) - 0.5')
    """
    spread, scaled = next((s, k) for since, s, k in SIDEKIQ_JITTER if ver >= since)
    if scaled:  # an integer in [0, spread * (count + 1) - 1]
        return f"rand({spread} * (count + 1))", f"{spread / 2:g} * (count + 1) - 0.5"
    return f"rand({spread}) * (count + 1)", f"{(spread - 1) / 2:g} * (count + 1)"


def block_delay(formula: Formula | None, count: int) -> tuple[float, float, float] | None:
    """``(low, mean, high)`` seconds the block gives for ``count``; ``None``: the default."""
    if formula is None:
        return None
    band = formula.band(count)
    if band is None or math.trunc(min(band[1], _LONGEST_S)) <= 0:
        return None  # Sidekiq rescues a raising block and ignores a delay <= 0
    low, mean, high = (min(v, _LONGEST_S) for v in band)
    if not formula.random:
        low = mean = high = float(math.trunc(mean))
    return max(low, 0.0), mean, high


def source_band(formula: Formula | None, count: int, ver: Version) -> Band:
    """Sidekiq's delay before retry ``count`` with ``formula`` as the block's answer."""
    own = block_delay(formula, count)
    if own is None:
        return sidekiq_band(count, ver)
    low, mean, high = own
    if ver < BLOCK_JITTER_SINCE:
        return Band(low, high, mean)
    extra = sidekiq_band(count, ver, base=0.0)
    return Band(low, high + extra.high, mean + extra.mean)


def read_retry_in(value: Any, ver: Version, notes: list[Note]) -> RetryIn:
    """The answers in a ``sidekiq_retry_in`` option; ``notes`` get what was not kept."""
    if value is None:
        return RetryIn()
    if isinstance(value, Dynamic):
        notes.append(Note("lossy", "sidekiq_retry_in", f"a {value} that could not be read (only "
                          "arithmetic in count, :kill, :discard and case/if on the error class "
                          "are); the schedule assumes Sidekiq's default formula (what Sidekiq "
                          "uses when the block returns nil) and any per-error answer is lost"))
        return RetryIn()
    if not isinstance(value, Mapping):
        return RetryIn(_answer(value, ver, notes))
    default: Answer = None
    per_error: dict[str, Answer] = {}
    for key, answer in value.items():
        if str(key) in _DEFAULT_KEYS:
            default = _answer(answer, ver, notes)
        else:
            per_error[str(key)] = _answer(answer, ver, notes)
    return RetryIn(default, per_error)


def _answer(value: Any, ver: Version, notes: list[Note]) -> Answer:
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lstrip(":") in ("kill", "discard"):
        if ver < RESULT_SYMBOLS_SINCE:
            notes.append(Note("lossy", "sidekiq_retry_in", f"{value}: Sidekiq before 6.5.2 does "
                              "not understand it and uses the default delay; so does the policy"))
            return None
        return "kill" if value.strip().lstrip(":") == "kill" else "discard"
    formula = _formula(value)
    if not formula.uses_count and not formula.random and block_delay(formula, 0) is None:
        notes.append(Note("info", "sidekiq_retry_in", f"{value}: not a positive delay, so "
                          "Sidekiq uses its default formula"))
        return None
    return formula


def _formula(value: Any) -> Formula:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return parse_formula(repr(value))
    if isinstance(value, str):
        if value.strip().startswith("P"):
            return parse_formula(repr(seconds_of(value, "sidekiq_retry_in")))
        try:
            return parse_formula(value)
        except FormulaError:
            pass
    raise bad_option(DIALECT, "sidekiq_retry_in", value, "must be seconds, a duration such as "
                     "'3.days', arithmetic in count, ':kill' or ':discard'")


def seconds_of(value: Any, key: str) -> float:
    """Seconds from a number, ``'3.days'`` or an ISO 8601 duration; at most about 31,700
    years (``_LONGEST_SPAN_S``), so every figure derived from it stays finite."""
    seconds = _seconds_of(value, key)
    if not 0 <= seconds <= _LONGEST_SPAN_S:
        raise bad_option(DIALECT, key, value, f"must be between 0 and {_LONGEST_SPAN_S:g} "
                         "seconds")
    return seconds


def _seconds_of(value: Any, key: str) -> float:
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


def offset_formula(old: Sequence[Band], retries: int, source: str
                   ) -> tuple[dict[str, Any], str]:
    """Sidekiq's and Faktory's default formula, ``count**4 + 15 + random``: the closest
    schedule (``fit_schedule``), jitter on for the random term (ojs-retry section 13.2).

    Section 3.4 names polynomial with coefficient 4.0 for it, but OJS has no constant
    offset (the ``+ 15``): scaled to keep the window, that shape retries first after
    well under a second, so it is used only where it is also the closest.
    """
    means = [b.mean for b in old]
    fit = fit_schedule(means)
    fields = schedule_fields(fit, retries, jitter=True)
    text = (f"count**4 + 15 + random: fitted as {fit.describe()}, the OJS schedule closest "
            f"retry by retry ({fit.error()}); jitter stands for the random term")
    spec_first = fit_shape(means, "polynomial", SPEC_COEFFICIENT).initial \
        if (fit.strategy, fit.coefficient) != ("polynomial", SPEC_COEFFICIENT) else means[0]
    if spec_first < means[0] / 2:
        text += (f". Not section 3.4's polynomial with backoff_coefficient 4.0: OJS has no "
                 f"constant offset (the + 15), so keeping the window that shape would retry "
                 f"first after {spec_first:g} s where {source} waits {means[0]:g} s")
    early = list(itertools.takewhile(lambda pair: pair[0] < pair[1].low,
                                     zip(fit.delays(len(old)), old, strict=True)))
    if early:
        said = ", ".join(f"retry {n} after {new:.3g} s where {source} waits at least "
                         f"{band.low:g} s" for n, (new, band) in enumerate(early[:3], start=1))
        text += (". No OJS schedule within tolerance keeps the first retries: "
                 f"{said}{' ...' if len(early) > 3 else ''}")
    return fields, text + "; " + cap_words(fields["max_interval"], fit, retries,
                                           jitter=True)
