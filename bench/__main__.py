"""``python -m bench [--quick] [--only SECTIONS] [--out PATH]``: benchmarks, tables, JSON.

Sections: ``core`` (micro-benchmarks of the core), ``e2e`` (throughput, native
against OJS, alternating rounds), ``timing`` (retry lateness) and ``memory``
(worker RSS with jobs waiting in backoff); ``web`` (the console's page times with
10,000 dead letters and 10,000 waiting retries per framework, ``bench.web``); ``reference``
(Dramatiq native, with its ``Results`` middleware, and with OJS: ``bench.reference``;
not in the default run, ``--only reference``). Workers are in-process
(``celery.contrib.testing.worker`` thread pool; ``dramatiq.Worker`` threads),
4 threads each; the memory runs use a fresh process per measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bench import core, e2e, env, memory, reference, report, timing
from bench.workload import VARIANTS, Side, Variant

#: Where results go unless --out says otherwise.
RESULTS_DIR = Path(__file__).parent / "results"
#: The sections of a default run, in run order.
ALL_SECTIONS = ("core", "e2e", "timing", "memory", "web")
#: Sections run only when ``--only`` names them.
EXTRA_SECTIONS = ("reference",)


def _settings(quick: bool) -> dict[str, Any]:
    """Sizes per mode, --quick in about 5 minutes and the full run near 20 on 2 cores.

    The timing runs offer 30 failing jobs/s (half of Celery's failure throughput
    here), so lateness measures the timers, not a backlog.
    Celery's failure path (traceback capture, result writes) runs 5-10x slower
    than Dramatiq's here, so Celery gets fewer jobs per batch; ``--jobs`` sets both.
    """
    if quick:
        return {"jobs": {"celery": 150, "dramatiq": 500}, "rounds": 5,
                "e2e_brokers": ("redis", "rabbitmq"), "timing_brokers": ("redis",),
                "per_delay": 15, "window": 3.0, "memory_jobs": 1000}
    return {"jobs": {"celery": 200, "dramatiq": 800}, "rounds": 3,
            "e2e_brokers": ("redis", "rabbitmq"), "timing_brokers": ("redis", "rabbitmq"),
            "per_delay": 60, "window": 12.0, "memory_jobs": 10_000}


def _side(framework: str, broker: str, variants: tuple[Variant, ...] = VARIANTS) -> Side:
    if framework == "celery":
        from bench.celery_side import CelerySide

        return CelerySide(broker, variants=variants)
    from bench.dramatiq_side import DramatiqSide

    return DramatiqSide(broker, variants=variants)


def _each_side(brokers: tuple[str, ...], work: Callable[[Side], list[dict[str, Any]]],
               frameworks: tuple[str, ...] = ("celery", "dramatiq"),
               variants: tuple[Variant, ...] = VARIANTS) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for broker in brokers:
        if not env.reachable(broker):
            print(f"skipping {broker}: not reachable", file=sys.stderr)
            continue
        for framework in frameworks:
            started = time.perf_counter()
            side = _side(framework, broker, variants)
            try:
                rows += work(side)
            finally:
                side.close()
            print(f"  {framework}/{broker}: {time.perf_counter() - started:.0f} s",
                  file=sys.stderr)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller runs (about 5 minutes)")
    parser.add_argument("--only", default=",".join(ALL_SECTIONS),
                        help="comma-separated sections to run (default: all)")
    parser.add_argument("--jobs", type=int, help="jobs per end-to-end batch, both frameworks")
    parser.add_argument("--out", type=Path, help="JSON file to write")
    args = parser.parse_args(argv)
    sections = [s for s in args.only.split(",") if s]
    unknown = set(sections) - set(ALL_SECTIONS) - set(EXTRA_SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; choose from "
                     f"{ALL_SECTIONS + EXTRA_SECTIONS}")
    settings = _settings(args.quick)
    if args.jobs:
        settings["jobs"] = {"celery": args.jobs, "dramatiq": args.jobs}
    env.quiet_logging()
    load_start = env.load_average()
    started = time.perf_counter()
    result: dict[str, Any] = {}
    timings: dict[str, float] = {}
    for section in sections:
        print(f"{section}...", file=sys.stderr)
        began = time.perf_counter()
        if section == "core":
            result["core"] = core.run(quick=args.quick)
        elif section == "e2e":
            result["e2e"] = _each_side(settings["e2e_brokers"], lambda side: e2e.run(
                side, jobs=settings["jobs"][side.framework], rounds=settings["rounds"]))
        elif section == "reference":
            result["reference"] = _each_side(
                settings["e2e_brokers"], lambda side: reference.run(
                    side, jobs=settings["jobs"][side.framework], rounds=settings["rounds"]),
                frameworks=("dramatiq",), variants=reference.ORDER)
        elif section == "timing":
            result["timing"] = _each_side(settings["timing_brokers"], lambda side: timing.run(
                side, per_delay=settings["per_delay"], window=settings["window"]))
        elif section == "web":
            from bench import web

            result["web"] = web.run() if env.reachable("redis") else []
            web.print_table(result["web"])
        else:
            result["memory"] = memory.run(("celery", "dramatiq"),
                                          jobs=settings["memory_jobs"])
        timings[section] = round(time.perf_counter() - began, 1)
    command = " ".join(["python -m bench", *(argv if argv is not None else sys.argv[1:])])
    result = {"meta": {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": command, "python": sys.version.split()[0],
        "machine": f"{platform.machine()}, {env.cpu_model()}", "cpus": os.cpu_count(),
        "load_start": load_start, "load_end": env.load_average(),
        "seconds": round(time.perf_counter() - started, 1), "section_seconds": timings,
        "settings": {k: list(v) if isinstance(v, tuple) else v for k, v in settings.items()},
        "workers": "in-process: Celery thread pool (start_worker), dramatiq.Worker; "
                   "4 threads each; Dramatiq worker_timeout 100 ms",
    }, **result}
    report.print_tables(result)
    out = args.out or RESULTS_DIR / ("quick.json" if args.quick else "full.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out} in {result['meta']['seconds']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
