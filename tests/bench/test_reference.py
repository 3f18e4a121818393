"""``bench.reference``: rounds rotate the three variants, and each ratio is of the medians."""

from __future__ import annotations

from typing import Any

import pytest

from bench import reference
from bench.workload import Journal, Mix, Variant

#: Jobs/s and CPU µs a job each variant reports in the fake side below.
SPEED = {"native": (1000.0, 100.0), "results": (500.0, 200.0), "ojs": (400.0, 250.0)}


class _Side:
    framework, broker = "dramatiq", "rabbitmq"

    def __init__(self) -> None:
        self.journal = Journal()
        self.runs: list[Variant] = []


def test_rounds_rotate_the_order_and_rows_hold_each_ratio(monkeypatch: pytest.MonkeyPatch) -> None:
    side = _Side()

    def batch(s: Any, variant: Variant, mix: Mix, jobs: int) -> tuple[float, float, float]:
        s.runs.append(variant)
        rate, cpu = SPEED[variant]
        return rate, cpu, 0.0

    monkeypatch.setattr(reference, "batch", batch)
    rows = reference.run(side, jobs=10, rounds=3)  # type: ignore[arg-type]
    warmup, measured = side.runs[:3], side.runs[3:]
    assert warmup == ["native", "results", "ojs"]
    firsts = [measured[i] for i in range(0, len(measured), 3)]
    # each round runs its three mixes in one order; the next round starts one step on
    assert firsts == ["native"] * 3 + ["results"] * 3 + ["ojs"] * 3
    assert [row["mix"] for row in rows] == ["success", "fail once", "exhausted + DLQ"]
    row = rows[0]
    assert (row["results_ratio"], row["ojs_ratio"], row["ojs_to_results"]) == (0.5, 0.4, 0.8)
    assert (row["native_cpu_us_per_job"], row["ojs_cpu_us_per_job"]) == (100, 250)
    assert row["ojs_rounds"] == [400.0] * 3
