"""Choosing a polynomial OJS schedule for a known sequence of expected delays.

``fit_polynomial`` finds ``initial * n ** coefficient`` that minimises the worst
per-retry ratio to the target delays (a minimax fit in log space), which is the
figure a ``Fidelity`` reports, so the chosen policy is the best one by the
measure users see.

>>> initial, coefficient = fit_polynomial([15.0 * n ** 4 for n in range(1, 6)])
>>> (round(initial, 3), coefficient)
(15.0, 4.0)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from ojs_adapters.durations import format_duration

#: Range searched for the exponent; Sidekiq's own is 4.
_LOW, _HIGH = 1.0, 8.0
#: The longest ``max_interval`` written (about 31 years): past it a timedelta overflows.
LONGEST_CAP_S = 10 ** 9
#: Exponent used when a single retry leaves it undetermined.
DEFAULT_EXPONENT = 4.0


def fit_polynomial(means: Sequence[float], *, digits: int = 2) -> tuple[float, float]:
    """``(initial_seconds, coefficient)`` for the target ``means`` (retry 1 first).

    The coefficient is rounded to ``digits`` decimals and the initial interval to
    the millisecond, the precision a policy file carries.
    """
    if not means or any(m <= 0 for m in means):
        raise ValueError("fit_polynomial needs positive expected delays")
    logs = [math.log(m) for m in means]
    xs = [math.log(n) for n in range(1, len(means) + 1)]
    if len(means) == 1:
        coefficient = DEFAULT_EXPONENT
    else:
        coefficient = round(_golden(lambda c: _spread(logs, xs, c)[0]), digits)
        coefficient = min(max(coefficient, _LOW), _HIGH)
    centre = _spread(logs, xs, coefficient)[1]
    return max(round(math.exp(centre), 3), 0.001), coefficient


def polynomial_fields(means: Sequence[float], retries: int) -> tuple[dict[str, Any], str]:
    """Policy fields of the fitted polynomial for ``means``, and a sentence saying so.

    ``max_interval`` is set 1.5 x the last delay, so neither the cap nor the
    cap after jitter ever binds: the sources fitted this way have no cap.
    """
    initial, coefficient = fit_polynomial(means)
    cap = min(math.ceil(1.5 * initial * float(retries) ** coefficient), LONGEST_CAP_S)
    fields = {"backoff_strategy": "polynomial", "backoff_coefficient": coefficient,
              "jitter": True, "initial_interval": format_duration(timedelta(seconds=initial)),
              "max_interval": format_duration(timedelta(seconds=cap))}
    return fields, (f"count**4 + 15 + random is not a pure polynomial; the policy uses "
                    f"{initial:g} s * n^{coefficient:g}, the closest by worst per-retry ratio, "
                    f"and max_interval {fields['max_interval']}, high enough never to bind "
                    "(the source has no cap)")


def _spread(logs: Sequence[float], xs: Sequence[float], c: float) -> tuple[float, float]:
    """Half-width and centre of ``log(mean) - c * log(n)`` over all retries."""
    diffs = [y - c * x for y, x in zip(logs, xs, strict=True)]
    high, low = max(diffs), min(diffs)
    return (high - low) / 2, (high + low) / 2


def _golden(f: Callable[[float], float]) -> float:
    """Minimum of a convex function of one variable on [_LOW, _HIGH]."""
    ratio = (math.sqrt(5) - 1) / 2
    a, b = _LOW, _HIGH
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(80):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = f(d)
    return (a + b) / 2
