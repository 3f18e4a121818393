"""Compare what a scenario's run left behind with what the scenario expects.

Every expectation is literal data from ``scenarios.yaml``; nothing here asks the
core what the right answer is, so a broken core fails the suite too.
"""

from __future__ import annotations

from typing import Any

from conformance.driver import Observation
from conformance.scenarios import Scenario

#: Allowed difference between an expected countdown and the one handed to the framework
#: (Dramatiq takes whole milliseconds).
COUNTDOWN_TOLERANCE = 0.0015
#: How much earlier than its countdown a retry may start, for clock granularity (RET-11).
EARLY_SLACK = 0.002
#: How much later than its countdown a retry may start before the gap counts as wrong.
DEFAULT_LATE_TOLERANCE = 5.0
#: Fields every history entry must have (ERR-012).
ENTRY_FIELDS = ("code", "message", "attempt", "occurred_at")


def check(scenario: Scenario, seen: Observation,
          late_tolerance: float = DEFAULT_LATE_TOLERANCE) -> list[str]:
    """Problems found, in plain words; an empty list means the scenario passed."""
    expect = scenario.expect
    problems: list[str] = list(seen.notes)
    if "rejected" in expect:
        if seen.rejected != expect["rejected"]:
            problems.append(f"expected the policy refused at enqueue with {expect['rejected']}, "
                            f"got {seen.rejected or 'no error'}")
        if seen.starts:
            problems.append(f"a refused job ran {len(seen.starts)} time(s)")
        return problems
    if seen.rejected:
        return [*problems, f"enqueue refused the job with {seen.rejected}"]
    if "attempts" in expect and len(seen.starts) != expect["attempts"]:
        problems.append(f"handler ran {len(seen.starts)} time(s), expected {expect['attempts']}")
    record = seen.record
    if record is None:
        return [*problems, "no job record"]
    problems += _check_record(expect, record)
    problems += _check_countdowns(scenario, expect, record, seen.starts, late_tolerance)
    if "dead_letter_queue" in expect and seen.in_dead_letter_queue != expect["dead_letter_queue"]:
        where = "is" if seen.in_dead_letter_queue else "is not"
        problems.append(f"the job {where} in the dead-letter queue")
    problems += _check_history(expect, record.get("errors") or [])
    return problems


def _check_record(expect: dict[str, Any] | Any, record: dict[str, Any]) -> list[str]:
    out = []
    for key in ("state", "outcome", "dead_lettered"):
        if key in expect and record.get(key) != expect[key]:
            out.append(f"record {key} is {record.get(key)!r}, expected {expect[key]!r}")
    return out


def _check_countdowns(scenario: Scenario, expect: Any, record: dict[str, Any],
                      starts: tuple[float, ...], late_tolerance: float) -> list[str]:
    out: list[str] = []
    given = [float(c) for c in record.get("countdowns") or []]
    if "countdowns" in expect:
        wanted = [float(c) for c in expect["countdowns"]]
        if len(given) != len(wanted) or any(
                abs(a - b) > COUNTDOWN_TOLERANCE for a, b in zip(given, wanted, strict=False)):
            out.append(f"countdowns handed to the framework were {given}, expected {wanted}")
    for n, countdown in enumerate(given[: max(len(starts) - 1, 0)]):
        gap = starts[n + 1] - starts[n]
        if gap < countdown - EARLY_SLACK:
            out.append(f"RET-11: attempt {n + 2} started {gap:.4f}s after attempt {n + 1}, "
                       f"before its {countdown:.4f}s countdown")
        crashed = scenario.step(n + 1).kind in ("crash", "timeout")
        if not crashed and gap > countdown + late_tolerance:
            out.append(f"attempt {n + 2} started {gap:.3f}s after attempt {n + 1}: more than "
                       f"{late_tolerance}s late for a {countdown:.3f}s countdown")
    return out


def _check_history(expect: Any, errors: list[dict[str, Any]]) -> list[str]:
    out = []
    for entry in errors:
        missing = [f for f in ENTRY_FIELDS if entry.get(f) in (None, "")]
        if missing:
            out.append(f"ERR-012: history entry {entry} lacks {missing}")
    if "history" in expect:
        wanted = expect["history"]
        if len(errors) != len(wanted):
            out.append(f"history has {len(errors)} entries, expected {len(wanted)}")
        for i, (got, want) in enumerate(zip(errors, wanted, strict=False)):
            for key, value in want.items():
                if got.get(key) != value:
                    out.append(f"history[{i}].{key} is {got.get(key)!r}, expected {value!r}")
    if "history_length_at_least" in expect and len(errors) < expect["history_length_at_least"]:
        out.append(f"history keeps {len(errors)} entries, fewer than "
                   f"{expect['history_length_at_least']}")
    if "newest_history_attempt" in expect:
        newest = errors[-1].get("attempt") if errors else None
        if newest != expect["newest_history_attempt"]:
            out.append(f"newest history entry is attempt {newest}, expected "
                       f"{expect['newest_history_attempt']}")
    return out
