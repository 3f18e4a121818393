"""Tables of a benchmark run: rich tables for the terminal, Markdown for the README.

``python -m bench.report bench/results/quick.json`` prints the Markdown of a saved run.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

#: A section: its title, column headers, and how a row becomes cells.
Section = tuple[str, list[str], Callable[[dict[str, Any]], list[str]]]


def _core(row: dict[str, Any]) -> list[str]:
    return [row["name"], f"{row['us_per_call']:.2f}"]


def _e2e(row: dict[str, Any]) -> list[str]:
    verdict = "met" if row["met"] else "missed"
    return [row["framework"], row["broker"], row["mix"], str(row["jobs"]),
            f"{row['native_jobs_s']:.0f}", f"{row['ojs_jobs_s']:.0f}",
            f"{row['ratio']:.2f}", f">={row['target']:.2f} {verdict}",
            f"{row['native_cpu_us_per_job']} / {row['ojs_cpu_us_per_job']}",
            _commands(row)]


def _commands(row: dict[str, Any]) -> str:
    if row["broker"] != "redis" or "ojs_redis_trips_per_job" not in row:
        return "-"
    text = f"{row['native_redis_trips_per_job']:.1f} / {row['ojs_redis_trips_per_job']:.1f}"
    budget = row.get("redis_trips_budget")
    if budget is None:
        return text
    verdict = "met" if row["ojs_redis_trips_per_job"] <= budget else "missed"
    return f"{text} (<={budget:.1f} {verdict})"


def _reference(row: dict[str, Any]) -> list[str]:
    return [row["framework"], row["broker"], row["mix"], str(row["jobs"]),
            f"{row['native_jobs_s']:.0f}", f"{row['results_jobs_s']:.0f}",
            f"{row['ojs_jobs_s']:.0f}", f"{row['results_ratio']:.2f}",
            f"{row['ojs_ratio']:.2f}", f"{row['ojs_to_results']:.2f}",
            f"{row['native_cpu_us_per_job']} / {row['results_cpu_us_per_job']} / "
            f"{row['ojs_cpu_us_per_job']}"]


def _timing(row: dict[str, Any]) -> list[str]:
    return [row["framework"], row["broker"], f"{row['delay_s']:g}", row["variant"],
            str(row["jobs"]), f"{row['p50_ms']:.1f}", f"{row['p99_ms']:.1f}"]


def _memory(row: dict[str, Any]) -> list[str]:
    return [row["framework"], row["variant"], str(row["jobs"]), f"{row['idle_mib']:.1f}",
            f"{row['peak_mib']:.1f}", f"{row['growth_mib']:.1f}"]


#: Every section of a result file, in print order.
SECTIONS: dict[str, Section] = {
    "core": ("Core (median per call)", ["operation", "us/call"], _core),
    "e2e": ("End to end, OJS vs native (jobs/s, median of rounds)",
            ["framework", "broker", "mix", "jobs", "native", "OJS", "OJS/native", "target",
             "CPU us/job native / OJS", "Redis round trips/job native / OJS"],
            _e2e),
    "reference": ("Dramatiq: native, with its Results middleware (Redis), and OJS "
                  "(jobs/s, median of rounds)",
                  ["framework", "broker", "mix", "jobs", "native", "+Results", "OJS",
                   "+Results/native", "OJS/native", "OJS/+Results",
                   "CPU us/job native / +Results / OJS"], _reference),
    "timing": ("Retry lateness (start - failure - countdown)",
               ["framework", "broker", "delay s", "variant", "jobs", "p50 ms", "p99 ms"],
               _timing),
    "memory": ("Worker RSS, jobs waiting in backoff (Redis)",
               ["framework", "variant", "jobs", "idle MiB", "peak MiB", "growth MiB"], _memory),
}


def print_tables(result: dict[str, Any], console: Console | None = None) -> None:
    """Print every section present in ``result`` as a rich table."""
    console = console or Console(width=max(Console().width, 132))
    meta = result["meta"]
    for key, (title, headers, cells) in SECTIONS.items():
        rows = result.get(key)
        if not rows:
            continue
        table = Table(title=f"{title} - {meta['date']}, load {meta['load_start']}")
        for header in headers:
            table.add_column(header, justify="left" if header.isalpha() else "right")
        for row in rows:
            table.add_row(*cells(row))
        console.print(table)


def markdown(result: dict[str, Any]) -> str:
    """Every section present in ``result`` as Markdown tables with a bold title."""
    out: list[str] = []
    for key, (title, headers, cells) in SECTIONS.items():
        rows = result.get(key)
        if not rows:
            continue
        out += [f"**{title}**", "", "| " + " | ".join(headers) + " |",
                "|" + "|".join(" --- " for _ in headers) + "|"]
        out += ["| " + " | ".join(cells(row)) + " |" for row in rows]
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(markdown(json.loads(Path(sys.argv[1]).read_text())))
