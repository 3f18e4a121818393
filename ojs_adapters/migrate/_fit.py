"""Choosing an OJS schedule for a known sequence of expected delays.

Every fit keeps the expected total retry window: the initial interval is set
so the new delays add up to the old ones, the window users of the old system
rely on. Among the shapes OJS offers (section 3: none, linear, exponential,
polynomial) ``fit_schedule`` then picks the one whose worst per-retry ratio is
closest to 1, counting first the retries a ``Fidelity`` judges (those off by
more than ``SLACK_S``). A formula the spec names keeps the spec's shape
instead (``fit_shape``: Sidekiq's is polynomial with coefficient 4.0, 3.4).

>>> fit = fit_schedule([30.0 * n for n in range(1, 6)])
>>> (fit.strategy, fit.initial, fit.exact)
('linear', 30.0, True)
>>> fit_shape([15.0 * n ** 4 for n in range(1, 4)], "polynomial", 4.0).describe()
'polynomial 15 s * n^4'
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ojs_adapters.backoff import BackoffStrategy, raw_delay
from ojs_adapters.migrate._common import MIN_INTERVAL_S, iso_seconds
from ojs_adapters.migrate._model import SLACK_S

#: The longest ``max_interval`` written (about 31 years): past it a timedelta overflows.
LONGEST_CAP_S = 10 ** 9
#: Coefficients searched, per strategy; polynomial's range includes Sidekiq's 4.
_RANGES: dict[BackoffStrategy, tuple[float, float]] = {
    "exponential": (1.0, 10.0), "polynomial": (1.0, 8.0)}
#: Shapes tried, simplest first: a later one must be strictly better to win.
#: ojs-retry section 3.4: the coefficient for Sidekiq's ``count**4`` (Faktory's too).
SPEC_COEFFICIENT = 4.0
_ORDER: tuple[BackoffStrategy, ...] = ("none", "linear", "exponential", "polynomial")


@dataclass(frozen=True, slots=True)
class Fit:
    """An OJS shape scaled to a target schedule, and how far it is from it.

    ``worst`` is the per-retry ratio (new over target) farthest from 1, at
    retry ``worst_retry``; ``window`` is the new total over the target total;
    ``judged`` is how far (in log ratio) the worst retry off by more than
    ``SLACK_S`` strays, 0 when none is.
    """

    strategy: BackoffStrategy
    initial: float
    coefficient: float
    worst: float
    worst_retry: int
    window: float
    judged: float = 0.0

    @property
    def exact(self) -> bool:
        """Whether every delay matches its target to a part in a million."""
        return abs(math.log(self.worst)) < 1e-6 if self.worst > 0 else False

    def describe(self) -> str:
        """The shape in words: ``'linear 30 s * n'``."""
        i, c = f"{self.initial:g} s", f"{self.coefficient:g}"
        return {"none": f"constant {i}", "linear": f"linear {i} * n",
                "exponential": f"exponential {i} * {c}^(n-1)",
                "polynomial": f"polynomial {i} * n^{c}"}[self.strategy]

    def error(self) -> str:
        """The fit's error in words: ``'exact'`` or the worst ratio and window error."""
        if self.exact:
            return "exact"
        return (f"worst per-retry ratio {self.worst:.3g} at retry {self.worst_retry}, "
                f"total window {100 * (self.window - 1):+.1f}%")


def fit_shape(targets: Sequence[float], strategy: BackoffStrategy, coefficient: float, *,
              rounded: bool = True) -> Fit:
    """``strategy`` with ``coefficient``, scaled so its total equals the targets' total.

    The initial interval keeps three significant digits and at least the
    millisecond (``rounded``), and is never below ``MIN_INTERVAL_S``.
    """
    _check(targets)
    shape = [_raw(strategy, n, 1.0, coefficient) for n in range(1, len(targets) + 1)]
    scale = math.fsum(targets) / math.fsum(shape)
    if rounded and scale > 0:
        scale = round(scale, max(3, 2 - math.floor(math.log10(scale))))
    return _measure(targets, strategy, max(scale, MIN_INTERVAL_S), coefficient)


def fit_schedule(targets: Sequence[float], *, digits: int = 2) -> Fit:
    """The window-keeping shape with the best worst per-retry ratio (coefficient to ``digits``)."""
    _check(targets)
    best = fit_shape(targets, "none", 1.0)
    for strategy in _ORDER[1:]:
        if strategy == "linear":
            candidate = fit_shape(targets, "linear", 1.0)
        else:
            low, high = _RANGES[strategy]
            if strategy == "exponential" and len(targets) > 1:
                high = min(high, math.exp(600.0 / (len(targets) - 1)))  # no float overflow
            found = _minimise(_worst_of(targets, strategy), low, high)
            rounded = round(found, digits)
            step = 10.0 ** -digits
            near = {min(max(round(rounded + k * step, digits), low), high)
                    for k in (-2, -1, 0, 1, 2)}
            candidate = min((fit_shape(targets, strategy, c) for c in sorted(near)), key=_stray)
        if _stray(candidate) < _stray(best) - 1e-9:
            best = candidate
    return best


def schedule_fields(fit: Fit, retries: int, *, jitter: bool) -> dict[str, Any]:
    """Policy fields for ``fit`` over ``retries``, with a ``max_interval`` that never binds.

    With ``jitter`` the cap is 1.5 x the last delay, so the cap after jitter
    never binds either: the sources fitted this way have no cap of their own.
    """
    top = _raw(fit.strategy, max(retries, 1), fit.initial, fit.coefficient)
    cap = min(math.ceil(top * (1.5 if jitter else 1.0) * 1000) / 1000, LONGEST_CAP_S)
    return {"backoff_strategy": fit.strategy, "backoff_coefficient": max(fit.coefficient, 1.0),
            "jitter": jitter, "initial_interval": iso_seconds(fit.initial),
            "max_interval": iso_seconds(max(cap, fit.initial))}


def _worst_of(targets: Sequence[float], strategy: BackoffStrategy) -> Callable[[float], float]:
    """How far the window-keeping fit of ``strategy`` strays, as a function of the coefficient."""
    return lambda coefficient: _stray(fit_shape(targets, strategy, coefficient, rounded=False))


def _measure(targets: Sequence[float], strategy: BackoffStrategy, initial: float,
             coefficient: float) -> Fit:
    new = [_raw(strategy, n, initial, coefficient) for n in range(1, len(targets) + 1)]
    strays = [abs(math.log(d / t)) if d > 0 else math.inf for d, t in zip(new, targets,
                                                                          strict=True)]
    at = max(range(len(strays)), key=strays.__getitem__)
    judged = max((s for s, d, t in zip(strays, new, targets, strict=True)
                  if abs(d - t) > SLACK_S), default=0.0)
    return Fit(strategy, initial, coefficient, new[at] / targets[at], at + 1,
               math.fsum(new) / math.fsum(targets), judged)


def _raw(strategy: BackoffStrategy, n: int, initial: float, coefficient: float) -> float:
    return min(raw_delay(strategy, n, initial, coefficient), 1e300)


def _stray(fit: Fit) -> float:
    """What a fit minimises: the judged retries first, then every retry."""
    overall = abs(math.log(fit.worst)) if fit.worst > 0 else math.inf
    return fit.judged + overall / 1000


def _check(targets: Sequence[float]) -> None:
    if not targets or not all(0 < t < math.inf for t in targets):
        raise ValueError("fitting needs finite positive expected delays")


def _minimise(f: Callable[[float], float], low: float, high: float) -> float:
    """The minimum of ``f`` on [low, high]: a coarse grid, then a golden-section search."""
    grid = [low + (high - low) * i / 40 for i in range(41)]
    at = min(range(len(grid)), key=lambda i: f(grid[i]))
    a, b = grid[max(at - 1, 0)], grid[min(at + 1, 40)]
    ratio = (math.sqrt(5) - 1) / 2
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(50):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = f(d)
    return (a + b) / 2


def spec_polynomial(means: Sequence[float], retries: int) -> tuple[dict[str, Any], str]:
    """Sidekiq's and Faktory's default formula the way ojs-retry section 3.4 maps it.

    The shape is polynomial with coefficient 4.0; OJS has no constant offset
    (Sidekiq's ``+ 15``), so the initial interval is what keeps the expected
    total window. Jitter stands for the random term (section 13.2).
    """
    fit = fit_shape(means, "polynomial", SPEC_COEFFICIENT)
    fields = schedule_fields(fit, retries, jitter=True)
    return fields, (
        f"count**4 + 15 + random: ojs-retry section 3.4 maps it to polynomial with "
        f"backoff_coefficient 4.0. OJS has no constant offset, so initial_interval "
        f"{fit.initial:g} s is the one that keeps the expected total retry window, and the "
        f"first retries come sooner than the source's; max_interval {fields['max_interval']} "
        "never binds (the source has no cap)")
