"""``ojs-retry migrate``: retry settings of another system to OJS policies."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from ojs_adapters.cli._io import (
    EXIT_UNSUPPORTED,
    console,
    human_seconds,
    print_json,
    read_text,
    reports_ojs_errors,
)
from ojs_adapters.errors import OjsValidationError
from ojs_adapters.migrate import DIALECTS, Migration, migrate_text, scan_path

#: Exit status when a job has no policy, or a lossy one not accepted with --allow-lossy:
#: both need a decision from a person, so they share the status.
EXIT_NEEDS_DECISION = EXIT_UNSUPPORTED


@click.command()
@click.option("--from", "dialect", required=True, type=click.Choice(sorted(DIALECTS)),
              help="The system the settings were written for.")
@click.argument("sources", metavar="[FILE|DIR]...", nargs=-1)
@click.option("--version", "version",
              help="Sidekiq, Faktory or Dramatiq version (the delay formula and defaults "
                   "depend on it).")
@click.option("--cap-unbounded", "cap", type=click.IntRange(min=1), metavar="N",
              help="Use N attempts where the source retries for ever (Celery max_retries=None, "
                   "Dramatiq retry_when, Temporal maximumAttempts 0). Noted as lossy (asked); "
                   "it does not fail the run.")
@click.option("--allow-lossy", is_flag=True,
              help="Exit 0 even when a translation is lossy (the notes still say what is lost).")
@click.option("--ruby", is_flag=True, help="Read stdin as Ruby source (sidekiq_options lines).")
@click.option("--rows", is_flag=True, help="Also print the fidelity table, retry by retry.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@reports_ojs_errors
def migrate(dialect: str, sources: tuple[str, ...], version: str | None, cap: int | None,
            allow_lossy: bool, ruby: bool, rows: bool, as_json: bool) -> None:
    """Translate another system's retry settings into OJS policies.

    FILE|DIR is a JSON or YAML file of options (one job's, a mapping of job
    names to options, or a list), a Sidekiq .rb file (literal sidekiq_options
    lines and sidekiq_retry_in blocks with literal answers; anything else is
    reported, not guessed), a directory searched for such files, or - (the
    default) for stdin. Several are read as one run (app/ and config/). For
    each job it prints the policy as JSON, the notes on every lossy or
    approximate step, and the fidelity: the worst ratio of new to old
    expected delay and the total retry window, old and new.

    A translation is lossy when a note says behaviour is lost or the schedule
    is not kept (a retry off by more than 2.5x and a minute, or the total
    window by more than 25%). A retry more than 2.5x sooner than the source's
    but under a minute off (Sidekiq's first retries) makes the verdict
    approximate, not ok; it does not fail the run. Exit status 3 when a job is lossy (unless
    --allow-lossy) or has no OJS equivalent at all (for example Celery
    max_retries=None: nothing is capped silently; pass --cap-unbounded N).

    \b
    Example:
      ojs-retry migrate --from sidekiq app/ config/ --version 7.3
      ojs-retry migrate --from celery tasks.yaml --json
      echo '{"retry": -1}' | ojs-retry migrate --from faktory -
      ojs-retry migrate --from celery tasks.json --cap-unbounded 50
      ojs-retry migrate --from sidekiq app/jobs/ --allow-lossy
    """
    spec = DIALECTS[dialect]
    if version is not None and not spec.takes_version:
        raise click.UsageError(f"--version does not apply to {dialect} (only to sidekiq, "
                               "faktory and dramatiq)")
    if cap is not None and not spec.takes_cap:
        raise click.UsageError(f"--cap-unbounded does not apply to {dialect}: it has no "
                               "unbounded retry setting")
    options: dict[str, Any] = {"version": version, "unbounded_attempts": cap}
    skipped: list[tuple[str, str]] = []
    if sources in ((), ("-",)):
        text, origin = read_text("-")
        found = migrate_text(dialect, text, origin=origin, ruby=ruby, **options)
    elif "-" in sources:
        raise click.UsageError("- (stdin) cannot be read with files or directories")
    else:
        found, skipped = scan_path(dialect, sources, **options)
    if not found:
        source = " ".join(sources) or "-"
        passed = "; ".join(f"{file} ({why})" for file, why in skipped)
        raise OjsValidationError(f"no {dialect} retry settings found in {source}" + (
                                     f"; passed over: {passed}" if passed else ""),
                                 code="INVALID_PAYLOAD",
                                 details={"field": source, "rule": "must hold retry settings"})
    ok = all(m.ok or (allow_lossy and m.policy is not None) for m in found)
    if as_json:
        print_json({"dialect": dialect, "ok": ok, "allow_lossy": allow_lossy,
                    "migrations": [m.to_dict() for m in found]})
    else:
        for migration in found:
            _show(migration, rows)
        _verdict(found, allow_lossy)
    if not ok:
        sys.exit(EXIT_NEEDS_DECISION)


def _verdict(found: list[Migration], allow_lossy: bool) -> None:
    """One closing line on stderr: how many jobs need a decision, and which flag decides."""
    missing = sum(m.policy is None for m in found)
    lossy = sum(m.policy is not None and m.lossy for m in found)
    if not missing and not lossy:
        return
    parts = [f"{missing} without an OJS policy"] if missing else []
    if lossy:
        parts.append(f"{lossy} lossy" + (" (accepted: --allow-lossy)" if allow_lossy
                                          else " (pass --allow-lossy to accept)"))
    wide = sum(m.app_wide for m in found)
    counted = _count(len(found) - wide, "job") + (f", {_count(wide, 'app-wide default')}"
                                                   if wide else "")
    click.echo(f"{counted} migrated: " + ", ".join(parts) + "; see the lossy and "
               "unsupported notes", err=True)


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _show(migration: Migration, rows: bool) -> None:
    out = console()
    title = migration.name or "(options)"
    where = f"  [{migration.origin}]" if migration.origin else ""
    out.rule(Text(f"{migration.dialect}: {title}{where}"), style="dim")
    if migration.policy is None:
        out.print("[bold red]no OJS policy[/bold red]: see the unsupported notes below")
    else:
        out.print(json.dumps(migration.policy.to_dict(), indent=2), markup=False)
    if migration.handler_codes:
        out.print("handler response codes needed:", markup=False)
        for error, code in migration.handler_codes.items():
            out.print(f"  raise JobError({error!r}, code={code!r})", markup=False)
    for note in migration.notes:
        out.print(f"  - {note}", markup=False)
    fidelity = migration.fidelity
    if fidelity is not None:
        out.print(f"fidelity: {fidelity.summary()}", markup=False)
        if rows and fidelity.rows:
            table = Table("Retry #", "Old delay", "New delay", "Ratio")
            for row in fidelity.rows:
                ratio = "inf" if math.isinf(row.ratio) else f"{row.ratio:.3g}"
                table.add_row(str(row.retry), _band(row.old.low, row.old.high),
                              _band(row.new.low, row.new.high), ratio)
            out.print(table)
    if migration.policy is not None:
        out.print(f"verdict: {_VERDICTS[migration.verdict](migration)}", markup=False)


_VERDICTS: dict[str, Callable[[Migration], str]] = {
    "lossy": lambda m: "LOSSY: behaviour is lost, see the lossy notes",
    "exact": lambda m: "exact",
    "ok": lambda m: "ok: approximate, intent kept",
    "approximate": lambda m: "approximate: " + (m.fidelity.hurry() if m.fidelity else "")
    + "; the rest is kept, see the notes",
}


def _band(low: float, high: float) -> str:
    if low == high:
        return human_seconds(low)
    return f"{human_seconds(low)} to {human_seconds(high)}"
