"""Timing accuracy: how late retries start after the countdown they were given.

Lateness of a retry = start of attempt 2 - time attempt 1 failed - countdown
(the failure time is taken in the job body just before it raises, so the
adapter's own decision and re-enqueue count as lateness). Each job fails once.
Jobs of every delay and both variants are sent interleaved at a steady pace
over ``window`` seconds, so retries come due spread out as in a live system,
not as one burst; both variants' workers run at the same time.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from bench.workload import TIMING_DELAYS, VARIANTS, Side


def percentile(values: list[float], pct: float) -> float:
    """The ``pct`` percentile (inclusive method; the max for tiny samples).

    >>> percentile([1.0, 2.0, 3.0, 4.0], 50)
    2.5
    """
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(pct) - 1]


def run(side: Side, *, per_delay: int, window: float) -> list[dict[str, Any]]:
    """Send ``per_delay`` jobs per delay and variant over ``window`` s; one row per pair."""
    total = per_delay * len(TIMING_DELAYS) * len(VARIANTS)
    side.journal.expect(total)
    side.start(VARIANTS)
    try:
        time.sleep(1.0)  # let the workers finish starting: their boot is not retry lateness
        began = time.monotonic()
        for i in range(per_delay):
            for delay in TIMING_DELAYS:
                for variant in VARIANTS:
                    side.send(variant, delay, f"{variant}|{delay}|{i}", 1)
            pause = began + (i + 1) * window / per_delay - time.monotonic()
            if pause > 0:
                time.sleep(pause)
        side.journal.wait(timeout=window + max(TIMING_DELAYS) + 60)
    finally:
        side.stop()
    late: dict[tuple[str, float], list[float]] = {}
    journal = side.journal
    for key, starts in journal.starts.items():
        name, countdown, _ = key.split("|")
        lateness = starts[1] - journal.fails[key][0] - float(countdown)
        late.setdefault((name, float(countdown)), []).append(lateness * 1000)
    rows = []
    for delay in TIMING_DELAYS:
        for variant in VARIANTS:
            values = late[variant, delay]
            rows.append({
                "framework": side.framework, "broker": side.broker, "delay_s": delay,
                "variant": variant, "jobs": len(values),
                "p50_ms": round(percentile(values, 50), 1),
                "p99_ms": round(percentile(values, 99), 1),
                "min_ms": round(min(values), 1), "max_ms": round(max(values), 1),
            })
    return rows
