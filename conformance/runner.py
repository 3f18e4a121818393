"""Run the scenarios through one driver and grade each one.

All jobs are submitted at once and run side by side, so a whole matrix cell
(one framework on one broker) takes about as long as its slowest scenario.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from conformance.check import DEFAULT_LATE_TOLERANCE, check
from conformance.driver import Driver, Observation
from conformance.scenarios import Scenario, load_scenarios
from conformance.script import AttemptLog
from ojs_adapters import OjsError

#: A scenario's grade.
Status = Literal["pass", "fail", "n/a"]
#: Record states after which nothing more happens to a job.
TERMINAL_STATES = frozenset({"completed", "discarded"})
#: How long to keep watching after every job looks finished, to catch late extra attempts.
SETTLE_SECONDS = 0.6


@dataclass(frozen=True)
class ScenarioResult:
    """How one scenario fared on one framework and broker."""

    scenario: Scenario
    status: Status
    problems: tuple[str, ...] = ()
    observation: Observation | None = None


def run_suite(
    driver_type: type[Driver],
    broker_url: str,
    scenarios: tuple[Scenario, ...] | None = None,
    *,
    timeout: float = 90.0,
    late_tolerance: float = DEFAULT_LATE_TOLERANCE,
) -> list[ScenarioResult]:
    """Run ``scenarios`` (default: all) on a fresh driver; one result per scenario."""
    scenarios = load_scenarios() if scenarios is None else scenarios
    with tempfile.TemporaryDirectory(prefix="ojs-conformance-") as folder:
        driver = driver_type(broker_url, Path(folder))
        runnable = tuple(s for s in scenarios if s.needs <= driver.capabilities)
        driver.start(runnable)
        try:
            seen = _run(driver, runnable, AttemptLog(folder), timeout)
        finally:
            driver.stop()
    results = []
    for scenario in scenarios:
        if scenario not in runnable:
            missing = ", ".join(sorted(scenario.needs - driver.capabilities))
            results.append(ScenarioResult(scenario, "n/a", (f"driver cannot: {missing}",)))
            continue
        problems = check(scenario, seen[scenario.id], late_tolerance)
        results.append(ScenarioResult(scenario, "fail" if problems else "pass",
                                      tuple(problems), seen[scenario.id]))
    return results


def _run(driver: Driver, scenarios: tuple[Scenario, ...], log: AttemptLog,
         timeout: float) -> dict[str, Observation]:
    keys: dict[str, str] = {}
    ids: dict[str, str | None] = {}
    rejected: dict[str, str] = {}
    for scenario in scenarios:
        key = keys[scenario.id] = f"{scenario.id}-{uuid.uuid4().hex[:8]}"
        try:
            ids[scenario.id] = driver.submit(scenario, key)
        except OjsError as exc:
            ids[scenario.id] = None
            rejected[scenario.id] = exc.code
    pending = {sid for sid, job in ids.items() if job is not None}
    deadline = time.monotonic() + timeout
    records: dict[str, dict[str, object] | None] = {}
    while pending and time.monotonic() < deadline:
        for sid in sorted(pending):
            job = ids[sid]
            assert job is not None
            record = records[sid] = driver.job_record(job)
            if record is not None and record.get("state") in TERMINAL_STATES:
                pending.discard(sid)
        time.sleep(0.05)
    time.sleep(SETTLE_SECONDS)
    dead = driver.dead_lettered_ids()
    out = {}
    for scenario in scenarios:
        sid, job = scenario.id, ids[scenario.id]
        notes = (f"did not finish within {timeout:.0f}s",) if sid in pending else ()
        out[sid] = Observation(
            scenario_id=sid,
            job_id=job,
            starts=tuple(log.starts(keys[sid])),
            record=driver.job_record(job) if job else None,
            in_dead_letter_queue=job in dead if job else False,
            rejected=rejected.get(sid),
            notes=notes,
        )
    return out


def requirement_matrix(results: list[ScenarioResult]) -> dict[str, Status]:
    """Per requirement: ``fail`` if any scenario for it failed, ``pass`` if any passed."""
    matrix: dict[str, Status] = {}
    for result in results:
        for req in result.scenario.requirements:
            now = matrix.get(req, "n/a")
            if result.status == "fail" or now == "fail":
                matrix[req] = "fail"
            elif result.status == "pass" or now == "pass":
                matrix[req] = "pass"
            else:
                matrix[req] = "n/a"
    return dict(sorted(matrix.items(), key=lambda kv: _req_key(kv[0])))


def _req_key(req: str) -> tuple[bool, int]:
    prefix, _, number = req.partition("-")
    return prefix != "RET", int(number) if number.isdigit() else 0
