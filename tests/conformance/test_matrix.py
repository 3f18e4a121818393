"""The full conformance matrix: both frameworks on memory, Redis and RabbitMQ (issue 5).

Each cell runs every scenario side by side through the framework's driver. On the
real brokers no scenario may be skipped; on the embedded brokers only scenarios
that need a worker process to kill or a time limit (Celery's threads pool has none)
are not applicable. Every cell's results are
written to ``conformance-report/`` as JSON and Markdown.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conformance import report
from conformance.drivers import get_driver
from conformance.runner import run_suite

#: Where each cell's matrix is written (ignored by git; the README quotes the latest).
REPORT_DIR = Path(__file__).resolve().parents[2] / "conformance-report"


@pytest.mark.broker
@pytest.mark.parametrize("framework", ["celery", "dramatiq"])
@pytest.mark.parametrize("broker", ["memory", "redis", "amqp"])
def test_matrix_cell(framework: str, broker: str, request: pytest.FixtureRequest) -> None:
    url = "memory" if broker == "memory" else request.getfixturevalue(f"{broker}_url")
    results = run_suite(get_driver(framework), url)
    cell = report.cell(framework, url, results)
    REPORT_DIR.mkdir(exist_ok=True)
    (REPORT_DIR / f"{framework}-{broker}.json").write_text(json.dumps(cell, indent=2) + "\n")
    failed = {r.scenario.id: list(r.problems) for r in results if r.status == "fail"}
    assert not failed, json.dumps(failed, indent=2)
    skipped = [r.scenario.id for r in results if r.status == "n/a"]
    if broker == "memory":  # in-process workers: nothing to kill; no Celery time limits
        assert all(r.scenario.needs for r in results if r.status == "n/a"), skipped
    else:
        assert not skipped, f"{framework} on {broker} skipped {skipped}"
