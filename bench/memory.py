"""Memory: peak worker RSS with many jobs waiting in backoff, native against OJS, on Redis.

Each measurement is a fresh process (``bench.memory_worker``), so one run's
garbage does not inflate the next; the figure is the process's ``VmHWM`` (its
peak RSS, producer included: the jobs are queued from the same process) and the
growth over its idle RSS. Natively, Celery holds every countdown (ETA) message in
the worker, and Dramatiq up to ``delay_prefetch`` (1,000 per worker thread),
leaving the rest in the broker's delay queue. With the adapters, a retry waiting
longer than 60 s is parked on the broker (``celery_ext._parking``,
``dramatiq_ext._parking``), so the OJS rows measure what parking saves.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench import env
from bench.workload import VARIANTS

#: The repository root, where ``python -m bench.memory_worker`` must run.
_ROOT = Path(__file__).resolve().parent.parent


def measure(framework: str, variant: str, jobs: int) -> dict[str, Any]:
    """One worker process's idle and peak RSS with ``jobs`` jobs waiting in backoff."""
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.memory_worker", framework, variant, str(jobs)],
        cwd=_ROOT, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    lines: list[dict[str, Any]] = []
    try:
        lines = [json.loads(line) for line in process.stdout]
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
        prefix = lines[0].get("prefix") if lines else None
        if prefix:
            env.delete_redis_keys(prefix)
    if process.returncode != 0 or len(lines) < 2:
        raise RuntimeError(f"memory worker {framework}/{variant} failed ({process.returncode})")
    found = lines[-1]
    return {"framework": framework, "broker": "redis", "variant": variant, "jobs": jobs,
            "idle_mib": round(found["idle_kib"] / 1024, 1),
            "peak_mib": round(found["VmHWM"] / 1024, 1),
            "growth_mib": round((found["VmHWM"] - found["idle_kib"]) / 1024, 1)}


def run(frameworks: tuple[str, ...], *, jobs: int) -> list[dict[str, Any]]:
    """Native and OJS for each framework; one row each."""
    return [measure(framework, variant, jobs) for framework in frameworks
            for variant in VARIANTS]
