"""End-to-end throughput, native against OJS, on the same broker in the same run.

A *batch* queues ``jobs`` jobs of one mix for one variant with no worker
running, then starts the worker and times from the first attempt's start to
the end of the last job (``Journal.busy_seconds``): worker throughput, without
the producer competing for the GIL. For the exhausted mix the batch then checks
that every job reached the dead-letter queue, and empties it.

Rounds alternate the order (native then OJS, then OJS then native, ...) so
drift in the machine's load falls on both sides; each figure is the median over
rounds, and the ratio is OJS / native of the medians. Beside jobs/s each batch
notes this process's CPU time per job (``time.process_time``, workers
included): steadier than wall time when other work shares the machine. On Redis it
also notes the Redis round trips per job (``env.count_redis_round_trips``): what the
retry machinery costs on the wire, free of timing noise.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from bench.env import ROUND_TRIPS, count_redis_round_trips
from bench.workload import E2E_DELAY, MAX_ATTEMPTS, MIXES, VARIANTS, Mix, Side, Variant

#: Targets (figures to compare with, not tests): OJS/native jobs/s per broker, and the
#: Redis round trips per job OJS may add to the native path, per mix (docs/cost.md).
RATIO_TARGETS = {"redis": 0.90, "rabbitmq": 0.80}
TRIP_BUDGETS = {"success": 1, "fail once": 3, "exhausted + DLQ": 5}


def batch(side: Side, variant: Variant, mix: Mix, jobs: int) -> tuple[float, float, float]:
    """Run one batch; return jobs per second, CPU microseconds and Redis round trips per job."""
    side.journal.expect(jobs)
    for i in range(jobs):
        side.send(variant, E2E_DELAY, f"{variant}-{i}", mix.fail_times)
    on_redis = side.broker == "redis"
    count_redis_round_trips()
    commands = ROUND_TRIPS[0]
    cpu = time.process_time()
    side.start((variant,))
    try:
        side.journal.wait(timeout=60 + jobs * mix.attempts / 10)
        cpu = time.process_time() - cpu
        rate = jobs / side.journal.busy_seconds()
        commands = ROUND_TRIPS[0] - commands if on_redis else 0
        if mix.dead_letters:
            _wait_dead_letters(side, variant, jobs)
    finally:
        side.stop()
    return rate, cpu / jobs * 1e6, commands / jobs


def _wait_dead_letters(side: Side, variant: Variant, jobs: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while (found := side.dead_letters(variant)) < jobs:
        if time.monotonic() > deadline:
            raise AssertionError(f"{side.framework} {variant}: {found} of {jobs} dead letters")
        time.sleep(0.05)
    side.purge_dead_letters(variant)


def jobs_for(mix: Mix, jobs: int) -> int:
    """Jobs per batch of ``mix``: ``jobs`` of the exhausted mix, more of the shorter ones
    (``jobs * MAX_ATTEMPTS`` attempts each), so no batch is so short that a worker's
    first moments weigh in its rate."""
    return round(jobs * MAX_ATTEMPTS / mix.attempts)


def run(side: Side, *, jobs: int, rounds: int, warmup: int = 30) -> list[dict[str, Any]]:
    """Every mix, ``rounds`` alternating rounds; one row per mix (``jobs_for`` its size)."""
    for variant in VARIANTS:  # connections, imports and caches, outside the figures
        batch(side, variant, MIXES[1], min(warmup, jobs))
    rates: dict[tuple[str, Variant], list[float]] = {}
    cpus: dict[tuple[str, Variant], list[float]] = {}
    commands: dict[tuple[str, Variant], list[float]] = {}
    for round_no in range(rounds):
        order = VARIANTS if round_no % 2 == 0 else VARIANTS[::-1]
        for mix in MIXES:
            for variant in order:
                rate, cpu, calls = batch(side, variant, mix, jobs_for(mix, jobs))
                rates.setdefault((mix.name, variant), []).append(rate)
                cpus.setdefault((mix.name, variant), []).append(cpu)
                commands.setdefault((mix.name, variant), []).append(calls)
    rows = []
    for mix in MIXES:
        native = statistics.median(rates[mix.name, "native"])
        ojs = statistics.median(rates[mix.name, "ojs"])
        ratio = ojs / native
        cpu_native = statistics.median(cpus[mix.name, "native"])
        cpu_ojs = statistics.median(cpus[mix.name, "ojs"])
        target = RATIO_TARGETS[side.broker]
        trips_native = round(min(commands[mix.name, "native"]), 1)
        trips_ojs = round(min(commands[mix.name, "ojs"]), 1)
        rows.append({
            "framework": side.framework, "broker": side.broker, "mix": mix.name,
            "jobs": jobs_for(mix, jobs), "rounds": rounds, "native_jobs_s": round(native, 1),
            "ojs_jobs_s": round(ojs, 1), "ratio": round(ratio, 3),
            "target": target, "met": ratio >= target,
            "native_cpu_us_per_job": round(cpu_native), "ojs_cpu_us_per_job": round(cpu_ojs),
            "native_redis_trips_per_job": trips_native,
            "ojs_redis_trips_per_job": trips_ojs,
            "redis_trips_budget": round(trips_native + TRIP_BUDGETS[mix.name], 1),
            "native_rounds": [round(r, 1) for r in rates[mix.name, "native"]],
            "ojs_rounds": [round(r, 1) for r in rates[mix.name, "ojs"]],
        })
    return rows
