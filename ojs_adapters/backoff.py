"""Backoff formulas (ojs-retry.md sections 3 and 5, Appendix A; RET-04, RET-05, RET-06).

All functions take and return seconds as floats. ``n`` is the retry number,
1-indexed: retry 1 is attempt 2.

>>> raw_delay("exponential", 10, 1.0, 2.0)
512.0
>>> final_delay(300.0, 300.0, 0.9)  # 300 * 1.4 -> capped again
300.0
"""

from __future__ import annotations

import math
from typing import Literal

#: The backoff strategies of section 3.
BackoffStrategy = Literal["none", "linear", "exponential", "polynomial"]

#: How jitter is applied: OJS's multiplier (the default) or the two opt-in extensions.
JitterMode = Literal["ojs", "full", "decorrelated"]

#: Lower and upper bound of the jitter multiplier, half-open (section 5.1).
JITTER_LOW, JITTER_HIGH = 0.5, 1.5
#: Growth factor of decorrelated jitter: the next delay is drawn from [base, 3 x previous).
DECORRELATED_GROWTH = 3.0


def raw_delay(strategy: BackoffStrategy, n: int, initial: float, coefficient: float) -> float:
    """The uncapped delay for retry ``n``; ``inf`` where the float would overflow."""
    if strategy == "none":
        return initial
    if strategy == "linear":
        return initial * n
    try:
        growth = coefficient ** (n - 1) if strategy == "exponential" else float(n) ** coefficient
    except OverflowError:
        return math.inf
    return initial * growth


def final_delay(capped: float, cap: float, jitter_sample: float | None) -> float:
    """Jitter an already capped delay and cap it again (section 5.1 and 5.3).

    ``jitter_sample`` u in [0, 1) maps to the multiplier 0.5 + u; ``None``
    means no jitter. The result is never negative.
    """
    if jitter_sample is not None:
        jittered = capped * (JITTER_LOW + jitter_sample)
        high = capped * JITTER_HIGH
        if jittered >= high:  # u just below 1 can round up to 1.5 x: keep [0.5, 1.5) half-open
            jittered = math.nextafter(high, 0.0)
        capped = jittered if jittered < cap else cap
    return capped if capped > 0.0 else 0.0


def full_jitter(capped: float, jitter_sample: float) -> float:
    """Full jitter (integration standard R-1): uniform in [0, capped)."""
    return capped * jitter_sample


def decorrelated_jitter(base: float, previous: float | None, cap: float,
                        jitter_sample: float) -> float:
    """Decorrelated jitter: drawn from [base, 3 x previous), capped (previous defaults to base).

    >>> decorrelated_jitter(1.0, 4.0, 300.0, 0.5)
    6.5
    """
    prior = base if previous is None or previous < base else previous
    drawn = base + (prior * DECORRELATED_GROWTH - base) * jitter_sample
    return drawn if drawn < cap else cap
