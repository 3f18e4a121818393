"""``ojs-retry demo``: watch Celery and Dramatiq retry the same jobs the same way.

On the embedded brokers (kombu ``memory://``, Dramatiq ``StubBroker``) by default,
or on ``--broker URL``: a handful of jobs show retry then success, a non-retryable
error going straight to the dead-letter queue, a handler's DISCARD, and
exhaustion after backoff. A live timeline shows each attempt; the summary shows
every job's error history and what sits in the dead-letter queues.
"""

from __future__ import annotations

import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from conformance.driver import Driver
from conformance.drivers import DRIVERS, get_driver
from conformance.report import broker_label
from conformance.runner import TERMINAL_STATES
from conformance.scenarios import Scenario, load_scenarios
from conformance.script import AttemptLog

#: The scenarios the demo runs, with the words it shows for each.
DEMO_JOBS: dict[str, str] = {
    "retry-then-success-keeps-history": "fails twice, then succeeds",
    "non-retryable-exact-match": "non-retryable error -> dead letter",
    "handler-discard": "handler says DISCARD",
    "exhaustion-dead-letters": "always fails: backoff, then dead letter",
}


@dataclass
class _Job:
    framework: str
    scenario: Scenario
    key: str
    job_id: str
    sent_at: float
    record: dict[str, Any] | None = None
    starts: list[float] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.record is not None and self.record.get("state") in TERMINAL_STATES


def _timeline(job: _Job) -> str:
    marks = []
    final = job.record.get("outcome") if job.record else None
    for n, start in enumerate(job.starts, 1):
        last = n == len(job.starts)
        ok = last and final == "completed"
        failed = not last or (job.done and final != "completed")
        sign = "[green]ok[/]" if ok else "[red]x[/]" if failed else "[yellow]..[/]"
        marks.append(f"{sign} +{start - job.sent_at:.2f}s")
    countdowns = (job.record or {}).get("countdowns") or []
    waits = " ".join(f"{c:.2f}s" for c in countdowns)
    return "  ".join(marks) + (f"   [dim]waits: {waits}[/]" if waits else "")


def _table(jobs: list[_Job]) -> Table:
    table = Table(title="OJS retries, live")
    for name in ("framework", "job", "attempts: result +time since sent", "state", "outcome"):
        table.add_column(name)
    for job in jobs:
        record = job.record or {}
        table.add_row(job.framework, DEMO_JOBS[job.scenario.id], _timeline(job),
                      str(record.get("state", "sent")), str(record.get("outcome") or ""))
    return table


def _summary(jobs: list[_Job], dead: dict[str, set[str]]) -> Group:
    parts: list[Any] = []
    for job in jobs:
        record = job.record or {}
        table = Table(title=f"{job.framework}: {DEMO_JOBS[job.scenario.id]} "
                            f"({record.get('outcome')}, {len(job.starts)} attempt(s))",
                      title_justify="left")
        for name in ("attempt", "code", "type", "handler_code", "occurred_at"):
            table.add_column(name)
        for entry in record.get("errors") or []:
            table.add_row(*(str(entry.get(k) or "") for k in
                            ("attempt", "code", "type", "handler_code", "occurred_at")))
        parts.append(table)
    lines = Table(title="dead-letter queues", title_justify="left")
    lines.add_column("framework")
    lines.add_column("jobs in the dead-letter queue")
    for framework, ids in dead.items():
        names = sorted(DEMO_JOBS[j.scenario.id] for j in jobs
                       if j.framework == framework and j.job_id in ids)
        lines.add_row(framework, "\n".join(names) or "(empty)")
    parts.append(lines)
    return Group(*parts)


def run_demo(broker: str, console: Console, timeout: float = 25.0) -> list[_Job]:
    """Run the demo jobs on every framework; return them with their final records."""
    scenarios = [s for s in load_scenarios() if s.id in DEMO_JOBS]
    drivers: dict[str, Driver] = {}
    jobs: list[_Job] = []
    dead: dict[str, set[str]] = {}
    with tempfile.TemporaryDirectory(prefix="ojs-demo-") as folder:
        log = AttemptLog(folder)
        try:
            for framework in sorted(DRIVERS):
                driver = drivers[framework] = get_driver(framework)(broker, Path(folder))
                driver.start(tuple(scenarios))
            for framework, driver in drivers.items():
                for scenario in scenarios:
                    key = f"{scenario.id}-{uuid.uuid4().hex[:8]}"
                    job_id = driver.submit(scenario, key)
                    jobs.append(_Job(framework, scenario, key, job_id, time.time()))
            deadline = time.monotonic() + timeout
            with Live(_table(jobs), console=console, refresh_per_second=8) as live:
                while time.monotonic() < deadline:
                    for job in jobs:
                        job.record = drivers[job.framework].job_record(job.job_id)
                        job.starts = log.starts(job.key)
                    live.update(_table(jobs))
                    if all(job.done for job in jobs):
                        break
                    time.sleep(0.1)
            time.sleep(0.5)
            for framework, driver in drivers.items():
                dead[framework] = driver.dead_lettered_ids()
            for job in jobs:
                job.record = drivers[job.framework].job_record(job.job_id)
        finally:
            for driver in drivers.values():
                driver.stop()
    console.print(_summary(jobs, dead))
    return jobs


@click.command("demo")
@click.option("--broker", default="memory", show_default=True,
              help="'memory' (embedded), or a redis://... or amqp://... URL.")
def command(broker: str) -> None:
    """Show OJS retries on Celery and Dramatiq side by side.

    \b
    Example:
      ojs-retry demo
      ojs-retry demo --broker redis://127.0.0.1:6379/0
    """
    console = Console()
    console.print(f"[bold]ojs-adapters demo[/] on {broker_label(broker)}: "
                  f"{len(DEMO_JOBS)} jobs x {len(DRIVERS)} frameworks")
    started = time.monotonic()
    jobs = run_demo(broker, console)
    unfinished = [j for j in jobs if not j.done]
    outcomes = {(j.framework, j.scenario.id): (j.record or {}).get("outcome") for j in jobs}
    same = all(outcomes[("celery", s)] == outcomes[("dramatiq", s)] for s in DEMO_JOBS)
    console.print(f"finished in {time.monotonic() - started:.1f}s; "
                  f"both frameworks agree on every outcome: {'yes' if same else 'NO'}")
    sys.exit(1 if unfinished or not same else 0)
