"""``pytest --pyargs conformance``: one test per scenario x framework x broker.

Each framework/broker cell runs once (all its jobs side by side); the tests then
report each scenario's grade. Not-applicable scenarios are skipped with the reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conformance import report
from conformance.drivers import DRIVERS, get_driver
from conformance.runner import ScenarioResult, run_suite
from conformance.scenarios import load_scenarios

_CELLS: dict[tuple[str, str], list[ScenarioResult]] = {}


def _frameworks(config: pytest.Config) -> list[str]:
    chosen = config.getoption("--ojs-framework", default="all") or "all"
    return sorted(DRIVERS) if chosen == "all" else [chosen]


def _brokers(config: pytest.Config) -> list[str]:
    return config.getoption("--ojs-broker", default=None) or ["memory"]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "cell" in metafunc.fixturenames:
        cells = [(f, b) for f in _frameworks(metafunc.config) for b in _brokers(metafunc.config)]
        metafunc.parametrize("cell", cells, ids=[f"{f}-{report.broker_label(b)}"
                                                for f, b in cells], scope="module")
        metafunc.parametrize("scenario_id", [s.id for s in load_scenarios()])


@pytest.fixture(scope="module")
def cell_results(cell: tuple[str, str], request: pytest.FixtureRequest) -> dict[str, Any]:
    if cell not in _CELLS:
        framework, broker = cell
        _CELLS[cell] = run_suite(get_driver(framework), broker)
        folder = request.config.getoption("--ojs-report", default=None)
        if folder:
            cells = [report.cell(f, b, r) for (f, b), r in _CELLS.items()]
            report.write(cells, Path(folder))
    return {r.scenario.id: r for r in _CELLS[cell]}


def test_scenario(cell: tuple[str, str], scenario_id: str, cell_results: dict[str, Any]) -> None:
    result: ScenarioResult = cell_results[scenario_id]
    if result.status == "n/a":
        pytest.skip("; ".join(result.problems))
    assert result.status == "pass", "\n".join(result.problems)
