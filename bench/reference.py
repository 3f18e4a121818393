"""A reference point for Dramatiq: what its own ``Results`` middleware costs beside OJS.

The e2e ratios compare OJS with each framework as it comes. A Celery app with a result
backend writes every outcome to Redis on both sides of its ratio; a Dramatiq app writes
nothing to Redis natively, so on RabbitMQ its ratio prices every Redis call OJS makes.
This section runs Dramatiq three ways on the same broker, rounds rotating the order:
native, native with ``Results`` keeping every job's result in Redis (``results``: one
Redis write a job, Dramatiq's first-party way to keep outcomes), and OJS. Same batches,
mixes and timing as ``bench.e2e``.
"""

from __future__ import annotations

import statistics
from typing import Any

from bench.e2e import batch, jobs_for
from bench.workload import MIXES, Side, Variant

#: The variants of a round, rotated one step each round.
ORDER: tuple[Variant, ...] = ("native", "results", "ojs")


def run(side: Side, *, jobs: int, rounds: int, warmup: int = 30) -> list[dict[str, Any]]:
    """Every mix, ``rounds`` rotating rounds of the three variants; one row per mix."""
    for variant in ORDER:  # connections, imports and caches, outside the figures
        batch(side, variant, MIXES[1], min(warmup, jobs))
    rates: dict[tuple[str, Variant], list[float]] = {}
    cpus: dict[tuple[str, Variant], list[float]] = {}
    for round_no in range(rounds):
        shift = round_no % len(ORDER)
        for mix in MIXES:
            for variant in ORDER[shift:] + ORDER[:shift]:
                rate, cpu, _ = batch(side, variant, mix, jobs_for(mix, jobs))
                rates.setdefault((mix.name, variant), []).append(rate)
                cpus.setdefault((mix.name, variant), []).append(cpu)
    rows = []
    for mix in MIXES:
        rate = {v: statistics.median(rates[mix.name, v]) for v in ORDER}
        cpu = {v: statistics.median(cpus[mix.name, v]) for v in ORDER}
        rows.append({
            "framework": side.framework, "broker": side.broker, "mix": mix.name,
            "jobs": jobs_for(mix, jobs), "rounds": rounds,
            **{f"{v}_jobs_s": round(rate[v], 1) for v in ORDER},
            **{f"{v}_cpu_us_per_job": round(cpu[v]) for v in ORDER},
            "results_ratio": round(rate["results"] / rate["native"], 3),
            "ojs_ratio": round(rate["ojs"] / rate["native"], 3),
            "ojs_to_results": round(rate["ojs"] / rate["results"], 3),
            **{f"{v}_rounds": [round(r, 1) for r in rates[mix.name, v]] for v in ORDER},
        })
    return rows
