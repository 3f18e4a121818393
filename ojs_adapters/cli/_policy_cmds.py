"""The verbs about one policy: ``validate``, ``schedule`` and ``explain``."""

from __future__ import annotations

import math
from typing import Any

import click
from rich.table import Table

from ojs_adapters.backoff import raw_delay
from ojs_adapters.cli._io import (
    console,
    human_seconds,
    print_json,
    read_policy,
    reports_ojs_errors,
)
from ojs_adapters.cli._plot import plot_schedule
from ojs_adapters.decision import Decision, decide
from ojs_adapters.failure import Failure, HandlerCode
from ojs_adapters.policy import RetryPolicy

_JSON = click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
_POLICY = click.argument("policy", metavar="POLICY", default="-")


@click.command()
@_POLICY
@_JSON
@reports_ojs_errors
def validate(policy: str, as_json: bool) -> None:
    """Check a policy against the OJS schema and rules; print the effective policy.

    POLICY is a JSON or YAML file (or - for stdin) holding the policy, or a job
    whose options.retry holds it. Missing fields take the defaults (RET-10).
    Exit status 1 with the OJS error (code, field, rule) when it is invalid.

    \b
    Example:
      ojs-retry validate payment-policy.yaml
      echo '{"max_attempts": -1}' | ojs-retry validate - --json
    """
    parsed, where = read_policy(policy)
    if as_json:
        print_json({"ok": True, "source": where, "policy": parsed.to_dict()})
        return
    out = console()
    out.print(f"valid OJS retry policy (from {where}); effective fields:")
    for key, value in parsed.to_dict().items():
        out.print(f"  {key}: {value}")


@click.command()
@_POLICY
@_JSON
@click.option("--limit", type=click.IntRange(min=0), default=100, show_default=True,
              help="Rows to show; 0 for every retry.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              help="Also draw the delay and its jitter band to this PNG (needs matplotlib).")
@reports_ojs_errors
def schedule(policy: str, as_json: bool, limit: int, plot_path: str | None) -> None:
    """Print the delay table: raw, capped, jitter band, cumulative.

    One row per retry: the attempt it starts, the raw backoff, the delay after
    the max_interval cap, the band jitter can move it in (section 5.2), and
    the cumulative capped wait since the first failure.

    \b
    Example:
      ojs-retry schedule policy.json
      ojs-retry schedule policy.yaml --limit 10 --json
      ojs-retry schedule policy.json --plot delays.png
    """
    parsed, _ = read_policy(policy)
    total = parsed.max_retries
    shown = total if limit == 0 else min(total, limit)
    rows = _rows(parsed, shown)
    if plot_path:
        plot_schedule(parsed, rows, plot_path)
    if as_json:
        print_json({"policy": parsed.to_dict(), "retries": total, "shown": shown,
                    "rows": rows, "plot": plot_path})
        return
    out = console()
    out.print(_describe(parsed))
    if not total:
        out.print("no retries: a failed job ends at once "
                  f"(on_exhaustion {parsed.on_exhaustion!r})")
        return
    table = Table("Attempt", "Retry #", "Raw delay", "Capped delay", "Jitter band",
                  "Cumulative")
    for row in rows:
        band = (f"[{human_seconds(row['jitter_low'])}, {human_seconds(row['jitter_high'])})"
                if parsed.jitter else "none")
        raw = "overflow" if row["raw"] is None else human_seconds(row["raw"])
        capped = human_seconds(row["capped"]) + (" (capped)" if row["is_capped"] else "")
        table.add_row(str(row["attempt"]), str(row["retry"]), raw, capped, band,
                      human_seconds(row["cumulative"]))
    out.print(table)
    if shown < total:
        out.print(f"... {total - shown} more retries (use --limit 0 to show all)")
    if plot_path:
        out.print(f"plot written to {plot_path}")


@click.command()
@_POLICY
@click.option("--error", "error_type", required=True, metavar="TYPE",
              help="The error type the handler failed with (e.g. payment.card_stolen).")
@click.option("--code", type=click.Choice(["RETRY", "DISCARD", "DEAD_LETTER", "FAIL"],
                                          case_sensitive=False),
              help="The handler's response code, if it gave one (section 7).")
@click.option("--attempt", type=int, required=True, help="The attempt that failed (1 = first).")
@click.option("--base", "bases", multiple=True, metavar="TYPE",
              help="A base-class name the error also answers to (repeatable).")
@click.option("--message", default="", help="The error message, for the history entry.")
@click.option("--worker-lost", is_flag=True,
              help="The worker died or the visibility timeout expired (section 9.2).")
@click.option("--jitter-sample", type=float, default=0.5, show_default=True,
              help="The jitter draw u in [0, 1) to show (0.5 is the unjittered delay).")
@_JSON
@reports_ojs_errors
def explain(policy: str, error_type: str, code: str | None, attempt: int,
            bases: tuple[str, ...], message: str, worker_lost: bool, jitter_sample: float,
            as_json: bool) -> None:
    """Say what decide() does after a failed attempt, and why.

    The rules run in the order of the spec: the handler response code, then
    non_retryable_errors, then the remaining attempts, then the backoff.

    \b
    Example:
      ojs-retry explain policy.json --error payment.card_stolen --attempt 1
      ojs-retry explain policy.yaml --error external.timeout --attempt 3 --json
      ojs-retry explain policy.json --error x --code DISCARD --attempt 1
    """
    parsed, _ = read_policy(policy)
    handler: HandlerCode | None = code.upper() if code else None  # type: ignore[assignment]
    if worker_lost:
        failure = Failure.worker_lost(message or "worker lost", error_type=error_type)
    else:
        failure = Failure(error_type, message or error_type, (error_type, *bases),
                          handler_code=handler)
    decision = decide(parsed, attempt, failure, jitter_sample=jitter_sample)
    lines = _explain(parsed, decision, failure)
    if as_json:
        band = parsed.jitter_bounds(attempt) if decision.action == "retry" else None
        print_json({
            "action": decision.action, "reason": decision.reason, "attempt": decision.attempt,
            "next_attempt": decision.next_attempt, "delay": decision.delay,
            "jitter_sample": decision.jitter_sample,
            "jitter_band": None if band is None else list(band),
            "matched": decision.matched, "entry": decision.entry.to_dict(),
            "explanation": lines,
        })
        return
    out = console()
    out.print(f"[bold]{decision.action.upper()}[/bold]  (reason: {decision.reason})")
    for line in lines:
        out.print(f"  - {line}", markup=False)


def _rows(policy: RetryPolicy, count: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    initial = policy.initial_interval.total_seconds()
    cumulative = 0.0
    for n in range(1, count + 1):
        raw = raw_delay(policy.backoff_strategy, n, initial=initial,
                        coefficient=policy.backoff_coefficient)
        capped = policy.capped_delay(n)
        low, high = policy.jitter_bounds(n)
        cumulative += capped
        rows.append({"attempt": n + 1, "retry": n, "raw": None if math.isinf(raw) else raw,
                     "capped": capped, "is_capped": raw > capped, "jitter_low": low,
                     "jitter_high": high, "cumulative": cumulative})
    return rows


def _describe(policy: RetryPolicy) -> str:
    initial = human_seconds(policy.initial_interval.total_seconds())
    shape = {
        "none": f"constant {initial}",
        "linear": f"linear {initial} x n",
        "exponential": f"exponential {initial} x {policy.backoff_coefficient:g}^(n-1)",
        "polynomial": f"polynomial {initial} x n^{policy.backoff_coefficient:g}",
    }[policy.backoff_strategy]
    return (f"max_attempts {policy.max_attempts} | {shape} | cap "
            f"{human_seconds(policy.max_interval.total_seconds())} | jitter "
            f"{'on' if policy.jitter else 'off'} | on_exhaustion {policy.on_exhaustion}")


def _explain(policy: RetryPolicy, decision: Decision, failure: Failure) -> list[str]:
    lines: list[str] = []
    ends = {"discard": "discarded", "dead_letter": "moved to the dead letter queue",
            "fail": "failed permanently (not retried, not dead-lettered)"}
    handler = failure.handler_code
    lines.append(f"1. handler response code: {handler or 'none'}"
                 + (" -> overrides the policy (section 7.2)" if decision.reason == "handler_code"
                    else " -> the policy decides"))
    if decision.reason == "handler_code":
        lines.append(f"The job is {ends[decision.action]} at attempt {decision.attempt}.")
        return lines
    if failure.stalled:
        lines.append("2. non_retryable_errors: skipped; a lost worker or expired visibility "
                     "timeout is always retryable while attempts remain (section 9.2)")
    elif decision.reason == "non_retryable":
        lines.append(f"2. non_retryable_errors: {failure.type!r} matches {decision.matched!r} "
                     f"-> no retry; on_exhaustion {policy.on_exhaustion!r} (section 6.3)")
        lines.append(f"The job is {ends[decision.action]} at attempt {decision.attempt}.")
        return lines
    else:
        lines.append(f"2. non_retryable_errors: no entry matches {failure.type!r}")
    if decision.reason == "exhausted":
        lines.append(f"3. attempts: attempt {decision.attempt} of max_attempts "
                     f"{policy.max_attempts} was the last -> on_exhaustion "
                     f"{policy.on_exhaustion!r}")
        lines.append(f"The job is {ends[decision.action]}.")
        return lines
    lines.append(f"3. attempts: {policy.max_attempts - decision.attempt} of "
                 f"{policy.max_attempts} remain after attempt {decision.attempt}")
    delay = decision.delay or 0.0
    band = policy.jitter_bounds(decision.attempt)
    jitter = (f"; jitter band [{human_seconds(band[0])}, {human_seconds(band[1])}), shown with "
              f"u = {decision.jitter_sample}" if policy.jitter else "; jitter off")
    lines.append(f"4. backoff: retry #{decision.attempt} waits "
                 f"{human_seconds(policy.capped_delay(decision.attempt))} after the cap{jitter}")
    lines.append(f"The job is retried as attempt {decision.next_attempt} after "
                 f"{human_seconds(delay)}.")
    return lines
