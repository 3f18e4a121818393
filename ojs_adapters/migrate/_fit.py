"""Choosing an OJS schedule for a known sequence of expected delays.

``fit_schedule`` picks, among the shapes OJS offers (section 3: none, linear,
exponential, polynomial) and their parameters, the schedule closest to the
targets retry by retry: the smallest worst ratio of new to old delay, a
retry that comes sooner counting double (``SOONER_WEIGHT``), ties broken by
the total retry window. It searches first among schedules a ``Fidelity``
keeps within tolerance (``strays``, ``window_holds``); where there is none,
the translation is lossy anyway and the fit keeps the total window instead
(``fit_shape``), the retries off by more than ``SLACK_S`` judged first.

>>> fit = fit_schedule([30.0 * n for n in range(1, 6)])
>>> (fit.strategy, fit.initial, fit.exact)
('linear', 30.0, True)
>>> fit_schedule([19.5, 25.0]).describe()  # Sidekiq's first two delays (7.x)
'exponential 19.521 s * 1.28^(n-1)'
>>> fit_shape([15.0 * n ** 4 for n in range(1, 4)], "polynomial", 4.0).describe()
'polynomial 15 s * n^4'
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ojs_adapters.backoff import BackoffStrategy, raw_delay
from ojs_adapters.migrate._common import MIN_INTERVAL_S, iso_seconds
from ojs_adapters.migrate._fidelity import (
    RETRY_TOLERANCE,
    SLACK_S,
    WINDOW_TOLERANCE,
    strays,
    window_holds,
)

#: The longest ``max_interval`` written (about 31 years): past it a timedelta overflows.
LONGEST_CAP_S = 10 ** 9
#: Coefficients searched, per strategy; polynomial's range includes Sidekiq's 4.
_RANGES: dict[BackoffStrategy, tuple[float, float]] = {
    "exponential": (1.0, 10.0), "polynomial": (1.0, 8.0)}
#: Shapes tried, simplest first: a later one must be exact, or closer by more than
#: ``_SIMPLER`` (1% in ratio), to win over a simpler one that is within tolerance.
_SIMPLER = math.log(1.01)
_ORDER: tuple[BackoffStrategy, ...] = ("none", "linear", "exponential", "polynomial")
#: How much more a retry that comes sooner than the source's counts than one that comes
#: later by the same factor: a sooner retry adds load on a downstream that is failing,
#: a later one only delays the recovery. 2: 1.5x sooner weighs like 2.25x later.
SOONER_WEIGHT = 2.0
#: Grid points per coefficient range before the golden-section search.
_GRID = 80
#: How far inside its tolerance a fit's initial interval is kept, so rounding stays inside.
_MARGIN = 1e-3


@dataclass(frozen=True, slots=True)
class Fit:
    """An OJS shape scaled to a target schedule, and how far it is from it.

    ``worst`` is the per-retry ratio (new over target) farthest from 1, at
    retry ``worst_retry``; ``window`` is the new total over the target total;
    ``cost`` is the worst per-retry log ratio with a sooner retry counting
    ``SOONER_WEIGHT`` times; ``within``, whether a ``Fidelity`` keeps every
    retry and the window within tolerance; ``judged`` is how far (in log ratio)
    the worst retry off by more than ``SLACK_S`` strays, 0 when none is.
    """

    strategy: BackoffStrategy
    initial: float
    coefficient: float
    worst: float
    worst_retry: int
    window: float
    judged: float = 0.0
    cost: float = 0.0
    within: bool = True

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
        worst = f"{self.worst:.3g}"
        if worst == "1":  # not exact: say how far off
            worst = f"{self.worst:.6f}".rstrip("0")
        return (f"worst per-retry ratio {worst} at retry {self.worst_retry}, "
                f"total window {100 * (self.window - 1):+.1f}%")

    def delays(self, retries: int) -> list[float]:
        """The expected delays of the fit for retries 1 to ``retries``."""
        return [_raw(self.strategy, n, self.initial, self.coefficient)
                for n in range(1, retries + 1)]


def fit_shape(targets: Sequence[float], strategy: BackoffStrategy, coefficient: float, *,
              rounded: bool = True) -> Fit:
    """``strategy`` with ``coefficient``, scaled so its total equals the targets' total.

    The initial interval keeps three significant digits and at least the
    millisecond (``rounded``), and is never below ``MIN_INTERVAL_S``.
    """
    _check(targets)
    shape = _shape(strategy, len(targets), coefficient)
    scale = math.fsum(targets) / math.fsum(shape)
    return _measure(targets, strategy, _rounded(scale) if rounded else scale, coefficient)


def fit_schedule(targets: Sequence[float], *, digits: int = 2) -> Fit:
    """The schedule closest to ``targets`` retry by retry (see the module), coefficient to
    ``digits``: among those within the fidelity tolerance if any is, else among those that
    keep the total window."""
    _check(targets)
    closest = _search(targets, digits, _closest, _closer)
    if closest.within:
        return closest
    return _search(targets, digits, lambda t, s, c, r: fit_shape(t, s, c, rounded=r),
                   lambda a, b: _stray(a) < _stray(b) - 1e-9)


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


def binds_from(fit: Fit, retries: int, *, jitter: bool) -> int | None:
    """The first retry whose delay, or its jittered top, the ``LONGEST_CAP_S`` cap of
    ``schedule_fields`` can cut; ``None`` when it never binds (delays only grow)."""
    def cut(n: int) -> bool:
        return _raw(fit.strategy, n, fit.initial, fit.coefficient) * (
            1.5 if jitter else 1.0) > LONGEST_CAP_S
    if retries < 1 or not cut(retries):
        return None
    low, high = 1, retries  # cut(high) holds
    while low < high:
        mid = (low + high) // 2
        low, high = (low, mid) if cut(mid) else (mid + 1, high)
    return low


def cap_words(cap: str, fit: Fit, retries: int, *, jitter: bool) -> str:
    """``max_interval`` in words for a source without a cap: whether it binds, and where."""
    at = binds_from(fit, retries, jitter=jitter)
    if at is None:
        return f"max_interval {cap} never binds (the source has no cap)"
    return (f"max_interval {cap}, the longest written (about 31 years; the source has no "
            f"cap), binds from retry {at}")


Scale = Callable[[Sequence[float], BackoffStrategy, float, bool], Fit]


def _search(targets: Sequence[float], digits: int, scale: Scale,
            better: Callable[[Fit, Fit], bool]) -> Fit:
    """The best fit by ``better`` over every shape, each coefficient searched and rounded."""
    best = scale(targets, "none", 1.0, True)
    for strategy in _ORDER[1:]:
        if strategy == "linear":
            candidate = scale(targets, "linear", 1.0, True)
        else:
            low, high = _RANGES[strategy]
            if strategy == "exponential" and len(targets) > 1:
                high = min(high, math.exp(600.0 / (len(targets) - 1)))  # no float overflow
            found = _minimise(functools.partial(_unrounded, scale, targets, strategy),
                              better, low, high)
            step = 10.0 ** -digits
            near = {min(max(round(round(found, digits) + k * step, digits), low), high)
                    for k in (-2, -1, 0, 1, 2)}
            if scale is _closest:  # a range within tolerance can be narrower than the grid
                near |= _tolerated_steps(targets, strategy, step, low, high)
            fits = [scale(targets, strategy, c, True) for c in sorted(near)]
            candidate = fits[0]
            for fit in fits[1:]:
                candidate = fit if better(fit, candidate) else candidate
        if better(candidate, best) and (candidate.exact or not best.within or not (
                candidate.within and best.cost - candidate.cost <= _SIMPLER)):
            best = candidate
    return best


def _tolerated_steps(targets: Sequence[float], strategy: BackoffStrategy, step: float,
                     low: float, high: float) -> set[float]:
    """Every coefficient on [low, high] at ``step`` for which some initial interval is
    within tolerance (``_tolerated``): such a range can be one step wide."""
    digits = round(-math.log10(step))
    steps = range(math.ceil(low / step - 1e-9), math.floor(high / step + 1e-9) + 1)
    found = set()
    for c in (round(k * step, digits) for k in steps):
        first, last = _tolerated(targets, _shape(strategy, len(targets), c))
        if first <= last:
            found.add(c)
    return found


def _unrounded(scale: Scale, targets: Sequence[float], strategy: BackoffStrategy,
               coefficient: float) -> Fit:
    return scale(targets, strategy, coefficient, False)


def _closest(targets: Sequence[float], strategy: BackoffStrategy, coefficient: float,
             rounded: bool) -> Fit:
    """``strategy`` with ``coefficient`` and the initial interval of smallest ``cost``,
    kept within the fidelity tolerance where some initial interval is."""
    shape = _shape(strategy, len(targets), coefficient)
    logs = [math.log(s / t) if s > 0 else -math.inf for s, t in zip(shape, targets, strict=True)]
    if not all(math.isfinite(v) for v in logs):
        return _measure(targets, strategy, MIN_INTERVAL_S, coefficient)
    # The cost is max(x + max(logs), -SOONER_WEIGHT * (x + min(logs))) with x = log(initial):
    # least where the two are equal.
    x = -(max(logs) + SOONER_WEIGHT * min(logs)) / (1 + SOONER_WEIGHT)
    low, high = _tolerated(targets, shape)
    if low <= high:
        x = min(max(x, math.log(low) + _MARGIN), math.log(high) - _MARGIN) \
            if high / low > math.exp(4 * _MARGIN) else math.log(math.sqrt(low * high))
    initial = math.exp(x)
    return _measure(targets, strategy, _rounded(initial) if rounded else initial, coefficient)


def _tolerated(targets: Sequence[float], shape: Sequence[float]) -> tuple[float, float]:
    """The initial intervals for which a ``Fidelity`` keeps every retry and the window
    (``strays``, ``window_holds``), as ``(low, high)``; empty when ``low > high``."""
    low, high = MIN_INTERVAL_S, math.inf
    pairs = [*zip(targets, shape, strict=True), (math.fsum(targets), math.fsum(shape))]
    for at, (old, unit) in enumerate(pairs):
        factor = RETRY_TOLERANCE if at < len(targets) else WINDOW_TOLERANCE
        low = max(low, min(old / factor, old - SLACK_S) / unit)
        high = min(high, max(old * factor, old + SLACK_S) / unit)
        if low > high:
            break  # empty: the rest cannot widen it
    return low, high


def _closer(a: Fit, b: Fit) -> bool:
    """Whether ``a`` is closer than ``b``: within tolerance first, then cost, then window."""
    if a.within != b.within:
        return a.within
    if abs(a.cost - b.cost) > 1e-9:
        return a.cost < b.cost
    return abs(math.log(a.window)) < abs(math.log(b.window)) - 1e-9


def _measure(targets: Sequence[float], strategy: BackoffStrategy, initial: float,
             coefficient: float) -> Fit:
    initial = max(initial, MIN_INTERVAL_S)
    new = [_raw(strategy, n, initial, coefficient) for n in range(1, len(targets) + 1)]
    logs = [math.log(d / t) if d > 0 else -math.inf for d, t in zip(new, targets, strict=True)]
    at = max(range(len(logs)), key=lambda i: abs(logs[i]))
    judged = max((abs(v) for v, d, t in zip(logs, new, targets, strict=True)
                  if abs(d - t) > SLACK_S), default=0.0)
    cost = max(max(v, -SOONER_WEIGHT * v) for v in logs)
    within = window_holds(math.fsum(new), math.fsum(targets)) and not any(
        strays(d, t) for d, t in zip(new, targets, strict=True))
    return Fit(strategy, initial, coefficient, new[at] / targets[at], at + 1,
               math.fsum(new) / math.fsum(targets), judged, cost, within)


def _shape(strategy: BackoffStrategy, count: int, coefficient: float) -> list[float]:
    return [_raw(strategy, n, 1.0, coefficient) for n in range(1, count + 1)]


def _raw(strategy: BackoffStrategy, n: int, initial: float, coefficient: float) -> float:
    return min(raw_delay(strategy, n, initial, coefficient), 1e300)


def _rounded(initial: float) -> float:
    """Three significant digits and at least the millisecond."""
    if initial <= 0:
        return initial
    return round(initial, max(3, 2 - math.floor(math.log10(initial))))


def _stray(fit: Fit) -> float:
    """What a window-keeping fit minimises: the judged retries first, then every retry."""
    overall = abs(math.log(fit.worst)) if fit.worst > 0 else math.inf
    return fit.judged + overall / 1000


def _check(targets: Sequence[float]) -> None:
    if not targets or not all(0 < t < math.inf for t in targets):
        raise ValueError("fitting needs finite positive expected delays")


def _minimise(fit: Callable[[float], Fit], better: Callable[[Fit, Fit], bool], low: float,
              high: float) -> float:
    """The best coefficient on [low, high] by ``better``: a grid, then a golden-section
    search between the best grid point's neighbours."""
    grid = [low + (high - low) * i / _GRID for i in range(_GRID + 1)]
    fits = [fit(c) for c in grid]
    at = 0
    for i in range(1, len(grid)):
        at = i if better(fits[i], fits[at]) else at
    a, b = grid[max(at - 1, 0)], grid[min(at + 1, _GRID)]
    ratio = (math.sqrt(5) - 1) / 2
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = fit(c), fit(d)
    for _ in range(50):
        if not better(fd, fc):
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = fit(c)
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = fit(d)
    return (a + b) / 2

