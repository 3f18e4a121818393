"""The conformance matrix as JSON, Markdown and a terminal table."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from rich.console import Console
from rich.table import Table

from conformance.runner import ScenarioResult, requirement_matrix

_MARK = {"pass": "pass", "fail": "FAIL", "n/a": "n/a"}


def broker_label(url: str) -> str:
    """A broker URL fit to print: scheme and host, password removed."""
    parts = urlsplit(url)
    if not parts.hostname:
        return parts.scheme or url
    host = parts.hostname + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def cell(framework: str, broker_url: str, results: list[ScenarioResult]) -> dict[str, Any]:
    """One matrix cell (framework x broker) as plain JSON."""
    return {
        "framework": framework,
        "broker": broker_label(broker_url),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "requirements": requirement_matrix(results),
        "scenarios": [
            {"id": r.scenario.id, "requirements": list(r.scenario.requirements),
             "status": r.status, "problems": list(r.problems)}
            for r in results
        ],
        "passed": sum(r.status == "pass" for r in results),
        "failed": sum(r.status == "fail" for r in results),
        "not_applicable": sum(r.status == "n/a" for r in results),
    }


def markdown(cells: list[dict[str, Any]]) -> str:
    """Requirement x (framework, broker) table, then per-cell scenario counts."""
    columns = [f"{c['framework']} / {c['broker']}" for c in cells]
    reqs = sorted({r for c in cells for r in c["requirements"]},
                  key=lambda r: (not r.startswith("RET"), int(r.split("-")[1])))
    lines = ["| requirement | " + " | ".join(columns) + " |",
             "| --- |" + " --- |" * len(columns)]
    for req in reqs:
        marks = [_MARK[c["requirements"].get(req, "n/a")] for c in cells]
        lines.append(f"| {req} | " + " | ".join(marks) + " |")
    lines.append("| scenarios passed / failed / n/a | " + " | ".join(
        f"{c['passed']} / {c['failed']} / {c['not_applicable']}" for c in cells) + " |")
    return "\n".join(lines) + "\n"


def write(cells: list[dict[str, Any]], folder: Path) -> tuple[Path, Path]:
    """Write ``matrix.json`` and ``matrix.md`` into ``folder``; return both paths."""
    folder.mkdir(parents=True, exist_ok=True)
    as_json, as_md = folder / "matrix.json", folder / "matrix.md"
    as_json.write_text(json.dumps(cells, indent=2) + "\n")
    as_md.write_text(markdown(cells))
    return as_json, as_md


def print_matrix(cells: list[dict[str, Any]], console: Console | None = None) -> None:
    """Print the matrix and every failing scenario's problems."""
    console = console or Console()
    table = Table(title="OJS retry conformance")
    table.add_column("requirement")
    for c in cells:
        table.add_column(f"{c['framework']}\n{c['broker']}", justify="center")
    reqs = sorted({r for c in cells for r in c["requirements"]},
                  key=lambda r: (not r.startswith("RET"), int(r.split("-")[1])))
    style = {"pass": "[green]pass[/]", "fail": "[bold red]FAIL[/]", "n/a": "[dim]n/a[/]"}
    for req in reqs:
        table.add_row(req, *[style[c["requirements"].get(req, "n/a")] for c in cells])
    console.print(table)
    for c in cells:
        for s in c["scenarios"]:
            if s["status"] == "fail":
                console.print(f"[red]{c['framework']} {c['broker']} {s['id']}[/]: "
                              + "; ".join(s["problems"]))
