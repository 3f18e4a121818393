"""``ojs-retry demo``: watch Celery and Dramatiq retry the same jobs the same way.

On the embedded brokers (kombu ``memory://``, Dramatiq ``StubBroker``) by default,
or on ``--broker URL``: a handful of jobs show retry then success, a non-retryable
error going straight to the dead-letter queue, a handler's DISCARD, and
exhaustion after backoff. A live table shows each attempt; then every job's error
history and what sits in the dead-letter queues. Everything fits 80 columns.

The frameworks' own logs (the tracebacks of the jobs that fail on purpose,
kombu's warnings) go to a log file whose path the demo prints at the end.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import click
from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from conformance._demo_log import append_file, captured
from conformance._demo_needs import broker_kind, runnable
from conformance.driver import Driver
from conformance.drivers import MEMORY_ALIASES, get_driver
from conformance.report import broker_label
from conformance.runner import TERMINAL_STATES
from conformance.scenarios import load_scenarios
from conformance.script import AttemptLog

#: The scenarios the demo runs, in the order shown, with a short label for each.
DEMO_JOBS: dict[str, str] = {
    "retry-then-success-keeps-history": "fails twice, then ok",
    "non-retryable-exact-match": "non-retryable error",
    "handler-discard": "handler says DISCARD",
    "exhaustion-dead-letters": "always fails",
}
#: Under the jobs table: what its marks say.
LEGEND = "x: the attempt failed; ok: it succeeded; ..: it is running."
#: Seconds the demo waits for every job to finish.
TIMEOUT = 25.0


@dataclass
class _Job:
    framework: str
    scenario_id: str
    key: str
    job_id: str
    sent_at: float
    record: dict[str, Any] | None = None
    starts: list[float] = field(default_factory=list)

    @property
    def label(self) -> str:
        return DEMO_JOBS[self.scenario_id]

    @property
    def done(self) -> bool:
        return self.record is not None and self.record.get("state") in TERMINAL_STATES


def result(record: dict[str, Any] | None) -> str:
    """What became of a job, from its record: ``dead-lettered``, else the record's state."""
    if record is None:
        return "sent"
    if record.get("dead_lettered"):
        return "dead-lettered"
    return str(record.get("state") or "sent")


def _table(title: str) -> Table:
    # No outer border, two spaces between columns: the widest table stays within 80.
    return Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False,
                 pad_edge=False, collapse_padding=True)


def _attempts(job: _Job) -> str:
    marks = []
    state = (job.record or {}).get("state")
    for n, start in enumerate(job.starts, 1):
        if n < len(job.starts) or (job.done and state != "completed") or state == "retryable":
            sign = "[red]x[/]"
        else:
            sign = "[green]ok[/]" if state == "completed" else "[yellow]..[/]"
        marks.append(f"{sign} +{start - job.sent_at:.2f}s")
    return "  ".join(marks)


def _jobs_table(jobs: list[_Job]) -> Table:
    table = _table("Jobs")
    table.add_column("job", overflow="fold")
    table.add_column("framework")
    table.add_column("attempts (s after send)", overflow="fold")
    table.add_column("result")
    shown = ""
    for job in jobs:
        table.add_row("" if job.label == shown else job.label, job.framework,
                      _attempts(job), result(job.record))
        shown = job.label
    table.caption = LEGEND
    table.caption_justify = "left"
    return table


def _then(record: dict[str, Any], entry: dict[str, Any], last: bool) -> str:
    """What the adapter did after a failed attempt: the retry's wait, or the end."""
    countdowns = record.get("countdowns") or []
    attempt = int(entry.get("attempt") or 0)
    if 0 < attempt <= len(countdowns):
        return f"retry in {float(countdowns[attempt - 1]):.2f}s"
    if not last or record.get("state") == "completed":
        return "retry"
    return result(record) if record.get("state") in TERMINAL_STATES else ""


def _seconds_after(job: _Job, stamp: object) -> str:
    try:
        at = datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return str(stamp)
    return f"+{at - job.sent_at:.2f}s"


def _history_table(label: str, group: list[_Job]) -> Table:
    rows = [(job, entry, n == len(errors))
            for job in group
            for errors in [(job.record or {}).get("errors") or []]
            for n, entry in enumerate(errors, 1)]
    with_handler = any(entry.get("handler_code") for _, entry, _ in rows)
    table = _table(label)
    for name in ("framework", "#", "code", "type", *(["handler"] * with_handler), "at", "then"):
        table.add_column(name, overflow="fold")
    shown = ""
    for job, entry, last in rows:
        handler = [str(entry.get("handler_code") or "")] * with_handler
        table.add_row("" if job.framework == shown else job.framework,
                      str(entry.get("attempt", "")), str(entry.get("code", "")),
                      str(entry.get("type", "")), *handler,
                      _seconds_after(job, entry.get("occurred_at")),
                      _then(job.record or {}, entry, last))
        shown = job.framework
    return table


def _summary(jobs: list[_Job], dead: dict[str, set[str]]) -> Group:
    parts: list[Any] = ["", "Error history, from each job's record:", ""]
    for label in DEMO_JOBS.values():
        group = [job for job in jobs if job.label == label]
        if any((job.record or {}).get("errors") for job in group):
            parts += [_history_table(label, group), ""]
    queues = _table("Dead-letter queues")
    queues.add_column("framework")
    queues.add_column("jobs in it", overflow="fold")
    for framework, ids in dead.items():
        names = [job.label for job in jobs if job.framework == framework and job.job_id in ids]
        queues.add_row(framework, ", ".join(names) or "(empty)")
    parts += [queues, ""]
    return Group(*parts)


def run_demo(broker: str, console: Console, log_path: Path, timeout: float = TIMEOUT,
             frameworks: tuple[str, ...] = ("celery", "dramatiq")) -> list[_Job]:
    """Run the demo jobs on ``frameworks``; return them with their final records.

    The frameworks' logging, warnings and stderr go to ``log_path``, with the
    logs of any worker subprocess appended at the end.
    """
    scenarios = tuple(s for s in load_scenarios() if s.id in DEMO_JOBS)
    drivers: dict[str, Driver] = {}
    jobs: list[_Job] = []
    dead: dict[str, set[str]] = {}
    with tempfile.TemporaryDirectory(prefix="ojs-demo-") as folder:
        log = AttemptLog(folder)
        try:
            with captured(log_path), _stopping(drivers):
                for framework in frameworks:
                    driver = drivers[framework] = get_driver(framework)(broker, Path(folder))
                    driver.start(scenarios)
                for scenario in sorted(scenarios, key=lambda s: list(DEMO_JOBS).index(s.id)):
                    for framework, driver in drivers.items():
                        key = f"{scenario.id}-{uuid.uuid4().hex[:8]}"
                        job_id = driver.submit(scenario, key)
                        jobs.append(_Job(framework, scenario.id, key, job_id, time.time()))
                _watch(jobs, drivers, log, console, timeout)
                time.sleep(0.5)
                for framework, driver in drivers.items():
                    dead[framework] = driver.dead_lettered_ids()
                for job in jobs:
                    job.record = drivers[job.framework].job_record(job.job_id)
        finally:
            for worker_log in sorted(Path(folder).glob("worker-*.log")):
                append_file(log_path, worker_log)
    console.print(_jobs_table(jobs))
    console.print(_summary(jobs, dead))
    return jobs


@contextmanager
def _stopping(drivers: dict[str, Driver]) -> Iterator[None]:
    """Stop every driver started in the block, however it ends."""
    try:
        yield
    finally:
        for driver in drivers.values():
            driver.stop()


def _watch(jobs: list[_Job], drivers: dict[str, Driver], log: AttemptLog, console: Console,
           timeout: float) -> None:
    """Poll the records until every job is done, showing them live on a terminal."""
    deadline = time.monotonic() + timeout
    # Transient: the final table is printed once afterwards, terminal or not.
    with Live(_jobs_table(jobs), console=console, refresh_per_second=8, transient=True,
              redirect_stdout=False, redirect_stderr=False) as live:
        while time.monotonic() < deadline:
            for job in jobs:
                job.record = drivers[job.framework].job_record(job.job_id)
                job.starts = log.starts(job.key)
            live.update(_jobs_table(jobs))
            if all(job.done for job in jobs):
                break
            time.sleep(0.1)


def _differences(jobs: list[_Job]) -> list[str]:
    """Labels of the jobs whose end differs between the frameworks."""
    ends: dict[str, set[tuple[object, ...]]] = {}
    for job in jobs:
        record = job.record or {}
        end = (result(record), record.get("outcome"), len(record.get("errors") or []))
        ends.setdefault(job.label, set()).add(end)
    return [label for label, seen in ends.items() if len(seen) > 1]


@click.command("demo")
@click.option("--broker", default="memory", show_default=True,
              help="'memory' (embedded), or a redis://... or amqp://... URL.")
@click.option("--log-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Where the frameworks' logs go (default: a new file in the temp folder).")
def command(broker: str, log_file: Path | None) -> None:
    """Show OJS retries on Celery and Dramatiq side by side.

    \b
    Example:
      ojs-retry demo
      ojs-retry demo --broker redis://127.0.0.1:6379/0
    """
    if log_file is None:
        fd, name = tempfile.mkstemp(prefix="ojs-demo-", suffix=".log")
        os.close(fd)
        log_file = Path(name)
    frameworks, notes = runnable(broker_kind(broker))
    console = Console()
    both = len(frameworks) > 1
    on = "each on Celery and on Dramatiq" if both else f"on {frameworks[0].capitalize()}"
    console.print(f"[bold]ojs-adapters demo[/]: {len(DEMO_JOBS)} jobs, {on}.", highlight=False)
    where = "memory (embedded)" if broker in MEMORY_ALIASES else broker_label(broker)
    same = " Each job has the same policy on both frameworks." if both else ""
    console.print(f"Broker: {where}.{same}", highlight=False)
    for note in notes:
        console.print(note, highlight=False, markup=False)
    console.print()
    started = time.monotonic()
    try:
        jobs = run_demo(broker, console, log_file, frameworks=tuple(frameworks))
    except BaseException:
        _print_log_path(console, log_file)
        raise
    unfinished = sorted({job.label for job in jobs if not job.done})
    differ = _differences(jobs)
    console.print(f"Finished in {time.monotonic() - started:.1f}s.", highlight=False)
    if unfinished:
        console.print(f"[red]Not finished after {TIMEOUT:.0f}s:[/] {', '.join(unfinished)}.")
    if differ:
        console.print(f"[red]Celery and Dramatiq differ on:[/] {', '.join(differ)}.")
    elif both:
        console.print("Celery and Dramatiq agree on every job.")
    _print_log_path(console, log_file)
    sys.exit(1 if unfinished or differ else 0)


def _print_log_path(console: Console, log_file: Path) -> None:
    console.print("Framework logs, with the tracebacks of the failing jobs:", highlight=False)
    console.print(str(log_file), highlight=False, soft_wrap=True)
