"""Micro-benchmarks of the core: ``decide``, ``policy.delay`` and ``RetryPolicy.from_dict``.

Each figure is the median, over ``repeats`` rounds, of the mean time per call in
a round of ``number`` calls, in microseconds.
"""

from __future__ import annotations

import statistics
import timeit
from collections.abc import Callable
from typing import Any

from ojs_adapters import JobError, RetryPolicy, decide
from ojs_adapters.policy import _cached_build

#: A policy with the fields people set most, as a mapping.
POLICY_DATA: dict[str, Any] = {
    "max_attempts": 5,
    "initial_interval": "PT1S",
    "non_retryable_errors": ["validation.*", "payment.card_stolen"],
    "on_exhaustion": "dead_letter",
}


def _per_call_us(func: Callable[[], object], number: int, repeats: int) -> float:
    rounds = timeit.repeat(func, number=number, repeat=repeats)
    return statistics.median(rounds) / number * 1e6


def run(*, quick: bool) -> list[dict[str, Any]]:
    """Time each core operation; return one row per operation."""
    number, repeats = (20_000, 7) if quick else (100_000, 15)
    policy = RetryPolicy.from_dict(POLICY_DATA)
    plain = ValueError("connection reset")
    job_error = JobError("payment.card_stolen", "stolen", code="DEAD_LETTER")
    cases: list[tuple[str, Callable[[], object]]] = [
        ("decide: retry (plain exception, drawn jitter)", lambda: decide(policy, 1, plain)),
        ("decide: exhausted -> dead_letter", lambda: decide(policy, 5, plain)),
        ("decide: handler code DEAD_LETTER", lambda: decide(policy, 1, job_error)),
        ("policy.delay(3) (drawn jitter)", lambda: policy.delay(3)),
        ("policy.delay(3, jitter_sample=0.3)", lambda: policy.delay(3, jitter_sample=0.3)),
        ("RetryPolicy.from_dict (cached)", lambda: RetryPolicy.from_dict(POLICY_DATA)),
    ]

    def cold() -> object:
        _cached_build.cache_clear()
        return RetryPolicy.from_dict(POLICY_DATA)

    cases.append(("RetryPolicy.from_dict (cold: schema + isodate)", cold))
    rows = []
    for name, func in cases:
        calls = number if "cold" not in name else max(number // 20, 200)
        rows.append({"group": "core", "name": name,
                     "us_per_call": round(_per_call_us(func, calls, repeats), 3)})
    return rows
