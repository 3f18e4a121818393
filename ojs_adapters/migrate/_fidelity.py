"""How closely a migrated schedule follows its source: ``Band``, ``FidelityRow``, ``Fidelity``.

Fidelity is judged on the whole schedule, retry by retry and over the total retry
window, against the tolerances below; a faithful schedule whose early retries come much
sooner than the source's is ``hurried``.

>>> band = Band(10.0, 20.0, 15.0)
>>> Fidelity((FidelityRow(1, band, Band(7.5, 22.5, 15.0)),)).worst_ratio
1.0
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

#: A retry strays when its expected delay is off by more than this factor ...
RETRY_TOLERANCE = 2.5
#: ... and by more than this many seconds: a ratio of short delays overstates a change.
SLACK_S = 60.0
#: The expected total retry window may be off by at most this factor (or ``SLACK_S``).
WINDOW_TOLERANCE = 1.25

@dataclass(frozen=True, slots=True)
class Band:
    """A delay in seconds as a range and its expected value (``low`` <= ``mean`` <= ``high``)."""

    low: float
    high: float
    mean: float

    def to_dict(self) -> dict[str, float]:
        """Plain JSON, rounded to the millisecond."""
        return {"low": _r(self.low), "high": _r(self.high), "mean": _r(self.mean)}


@dataclass(frozen=True, slots=True)
class FidelityRow:
    """The old and new delay before retry ``retry`` (1-indexed; retry 1 is attempt 2)."""

    retry: int
    old: Band
    new: Band

    @property
    def ratio(self) -> float:
        """New expected delay over old: above 1 the OJS policy waits longer."""
        return _ratio(self.new.mean, self.old.mean)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON; an infinite ratio is written as ``null``."""
        ratio = self.ratio
        return {"retry": self.retry, "old": self.old.to_dict(), "new": self.new.to_dict(),
                "ratio": None if math.isinf(ratio) else round(ratio, 4)}


@dataclass(frozen=True, slots=True)
class Fidelity:
    """How closely the new schedule follows the old one, retry by retry.

    ``worst_ratio`` is the per-retry ratio of expected delays farthest from 1
    (by factor, so 0.5 and 2.0 are equally bad); ``exact`` holds when every
    band matches to the millisecond.
    """

    rows: tuple[FidelityRow, ...]
    #: Retries the policy allows; more than ``len(rows)`` when only the first were compared.
    retries: int | None = None

    @property
    def compared_all(self) -> bool:
        """Whether every retry of the policy has a row."""
        return self.retries is None or self.retries <= len(self.rows)

    @property
    def worst(self) -> FidelityRow | None:
        """The row whose ratio strays most from 1, ``None`` with no retries."""
        if not self.rows:
            return None
        return max(self.rows, key=lambda row: _stray(row.ratio))

    @property
    def worst_ratio(self) -> float:
        """The ratio of the ``worst`` row; 1.0 when there are no retries."""
        worst = self.worst
        return 1.0 if worst is None else worst.ratio

    @property
    def old_total(self) -> float:
        """Expected seconds from the first failure to the last retry, old schedule."""
        return math.fsum(row.old.mean for row in self.rows)

    @property
    def new_total(self) -> float:
        """Expected seconds from the first failure to the last retry, new schedule."""
        return math.fsum(row.new.mean for row in self.rows)

    @property
    def window_ratio(self) -> float:
        """New expected total retry window over the old one (1.0 when both are empty)."""
        return _ratio(self.new_total, self.old_total)

    @property
    def strays(self) -> tuple[FidelityRow, ...]:
        """Rows off by more than ``RETRY_TOLERANCE`` and by more than ``SLACK_S``."""
        return tuple(row for row in self.rows if strays(row.new.mean, row.old.mean))

    @property
    def hurried(self) -> tuple[FidelityRow, ...]:
        """Rows more than ``RETRY_TOLERANCE`` sooner than the source's but within ``SLACK_S``.

        The slack keeps a ratio of short delays from overstating a change, which holds
        for a retry that comes later; one that comes 2.5x sooner (0.8 s where Sidekiq
        waits 19.5 s) puts retries on a failing downstream the source never did.
        """
        return tuple(row for row in self.rows if row.ratio < 1 / RETRY_TOLERANCE
                     and not strays(row.new.mean, row.old.mean))

    def hurry(self) -> str:
        """The ``hurried`` rows in words (up to three), ``''`` when there are none:
        ``'retry 1 comes more than 2.5x sooner than the source's: 0.82s where it waits
        19.5s (0.042x)'``."""
        rows = self.hurried
        if not rows:
            return ""
        said = ", ".join(f"{human_span(r.new.mean)} where it waits {human_span(r.old.mean)} "
                         f"({r.ratio:.2g}x)" for r in rows[:3])
        which = (f"retry {rows[0].retry} comes" if len(rows) == 1 else
                 f"retries {', '.join(str(r.retry) for r in rows[:3])}"
                 f"{' ...' if len(rows) > 3 else ''} come")
        return f"{which} more than {RETRY_TOLERANCE:g}x sooner than the source's: {said}"

    @property
    def window_ok(self) -> bool:
        """Whether the total window is within ``WINDOW_TOLERANCE`` (or ``SLACK_S``)."""
        return window_holds(self.new_total, self.old_total)

    @property
    def faithful(self) -> bool:
        """No retry strays and the total window holds: the schedule keeps its intent."""
        return self.window_ok and not self.strays

    @property
    def exact(self) -> bool:
        """Whether every old and new band agree to the millisecond."""
        return all(row.old.to_dict() == row.new.to_dict() for row in self.rows)

    def summary(self) -> str:
        """One line for people: the worst ratio, where, and the two total windows."""
        worst = self.worst
        if worst is None:
            return "no retries to compare"
        scope = "" if self.compared_all else f" (first {len(self.rows)} of {self.retries} " \
            "retries compared)"
        if self.exact:
            return f"exact: all {len(self.rows)} retry delays match{scope}"
        ratio = "inf" if math.isinf(worst.ratio) else f"{worst.ratio:.3g}"
        window = self.window_ratio
        change = "" if math.isinf(window) else f" ({100 * (window - 1):+.1f}%)"
        return (f"worst ratio {ratio} (new/old expected delay: {human_span(worst.new.mean)} "
                f"for {human_span(worst.old.mean)}) at retry {worst.retry}; "
                f"expected total wait {human_span(self.old_total)} -> "
                f"{human_span(self.new_total)}{change}{scope}")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON with the summary figures first."""
        worst = self.worst
        ratio = self.worst_ratio
        window = self.window_ratio
        return {
            "worst_ratio": None if math.isinf(ratio) else round(ratio, 4),
            "worst_retry": None if worst is None else worst.retry,
            "window_ratio": None if math.isinf(window) else round(window, 4),
            "faithful": self.faithful,
            "hurried": [row.retry for row in self.hurried],
            "exact": self.exact,
            "retries_compared": len(self.rows),
            "old_total_seconds": _r(self.old_total),
            "new_total_seconds": _r(self.new_total),
            "summary": self.summary(),
            "rows": [row.to_dict() for row in self.rows],
        }


def strays(new: float, old: float) -> bool:
    """Whether an expected delay of ``new`` seconds where the source waits ``old`` is off
    by more than ``RETRY_TOLERANCE`` and by more than ``SLACK_S``."""
    return _stray(_ratio(new, old)) > math.log(RETRY_TOLERANCE) and abs(new - old) > SLACK_S


def window_holds(new_total: float, old_total: float) -> bool:
    """Whether a total retry window of ``new_total`` seconds keeps ``old_total``: within
    ``WINDOW_TOLERANCE``, or ``SLACK_S``."""
    return (_stray(_ratio(new_total, old_total)) <= math.log(WINDOW_TOLERANCE)
            or abs(new_total - old_total) <= SLACK_S)


def _ratio(new: float, old: float) -> float:
    if old == 0:
        return 1.0 if new == 0 else math.inf
    return new / old


def _stray(ratio: float) -> float:
    if ratio == 0 or math.isinf(ratio):
        return math.inf
    return abs(math.log(ratio))


def _r(seconds: float) -> float:
    return round(seconds, 3)


def human_span(seconds: float) -> str:
    """``20.4d``, ``3.2h``, ``12m``, ``45s``: a short reading of a length of time."""
    for unit, size in (("d", 86_400.0), ("h", 3_600.0), ("m", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.3g}{unit}"
    return f"{seconds:.3g}s"
