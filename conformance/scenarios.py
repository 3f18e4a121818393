"""The conformance scenarios: loaded from ``scenarios.yaml`` and checked for shape.

A scenario is one job: a policy, a per-attempt script for the handler and the
expected outcome. Drivers run scenarios; ``conformance.check`` compares.

>>> [s.id for s in load_scenarios()][:2]
['default-policy-retries-twice', 'partial-policy-merges-with-defaults']
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import yaml

#: What a handler step may do.
STEP_KINDS = frozenset({"succeed", "raise", "job_error", "timeout", "crash"})
#: Capabilities a scenario may need from a driver.
CAPABILITIES = frozenset({"crash", "time_limit"})
#: Keys an ``expect`` block may hold.
EXPECT_KEYS = frozenset({
    "attempts", "countdowns", "state", "outcome", "dead_lettered", "dead_letter_queue",
    "history", "history_length_at_least", "newest_history_attempt", "rejected",
})


@dataclass(frozen=True)
class Step:
    """One attempt's behaviour: ``kind`` and its argument (a class path or a JobError spec)."""

    kind: str
    arg: Any = None

    def to_json(self) -> dict[str, Any]:
        """A plain form that travels as a job argument."""
        return {"kind": self.kind, "arg": self.arg}


@dataclass(frozen=True)
class Scenario:
    """One job to run and what must come of it."""

    id: str
    requirements: tuple[str, ...]
    script: tuple[Step, ...]
    expect: Mapping[str, Any]
    policy: Mapping[str, Any] | None = None
    jitter_sample: float | None = None
    needs: frozenset[str] = field(default_factory=frozenset)

    def step(self, attempt: int) -> Step:
        """The step for attempt ``attempt`` (1-indexed); the last step repeats."""
        return self.script[min(attempt, len(self.script)) - 1]


def _step(raw: Any, where: str) -> Step:
    if raw in ("succeed", "timeout", "crash"):
        return Step(str(raw))
    if isinstance(raw, Mapping) and len(raw) == 1:
        ((kind, arg),) = raw.items()
        if kind == "raise" and isinstance(arg, str):
            return Step("raise", arg)
        if kind == "job_error" and isinstance(arg, Mapping) and "type" in arg:
            return Step("job_error", dict(arg))
    raise ValueError(f"{where}: a step is succeed, timeout, crash, raise: CLASS or "
                     f"job_error: {{type, code, message}}; got {raw!r}")


def parse_scenario(raw: Mapping[str, Any]) -> Scenario:
    """Check one scenario mapping and build the value; ``ValueError`` names the problem."""
    sid = raw.get("id")
    if not isinstance(sid, str) or not sid:
        raise ValueError(f"a scenario needs an id: {raw!r}")
    unknown = set(raw) - {"id", "requirements", "policy", "jitter_sample", "script", "expect",
                          "needs"}
    if unknown:
        raise ValueError(f"{sid}: unknown keys {sorted(unknown)}")
    expect = raw.get("expect")
    if not isinstance(expect, Mapping) or not expect or set(expect) - EXPECT_KEYS:
        raise ValueError(f"{sid}: expect must map some of {sorted(EXPECT_KEYS)}")
    script = raw.get("script")
    if not isinstance(script, list) or not script:
        raise ValueError(f"{sid}: script must be a non-empty list")
    needs = frozenset(raw.get("needs", ()))
    if needs - CAPABILITIES:
        raise ValueError(f"{sid}: unknown needs {sorted(needs - CAPABILITIES)}")
    requirements = tuple(raw.get("requirements", ()))
    if not requirements:
        raise ValueError(f"{sid}: name the requirements it proves")
    sample = raw.get("jitter_sample")
    if sample is not None and not 0.0 <= float(sample) < 1.0:
        raise ValueError(f"{sid}: jitter_sample must be in [0, 1)")
    return Scenario(
        id=sid,
        requirements=requirements,
        script=tuple(_step(s, f"{sid} script[{i}]") for i, s in enumerate(script)),
        expect=dict(expect),
        policy=raw.get("policy"),
        jitter_sample=None if sample is None else float(sample),
        needs=needs,
    )


@cache
def load_scenarios() -> tuple[Scenario, ...]:
    """Every scenario shipped with the package, in file order; ids are unique."""
    text = resources.files("conformance").joinpath("scenarios.yaml").read_text("utf-8")
    scenarios = tuple(parse_scenario(raw) for raw in yaml.safe_load(text))
    ids = [s.id for s in scenarios]
    if len(ids) != len(set(ids)):
        raise ValueError("duplicate scenario ids in scenarios.yaml")
    return scenarios


def requirements_covered() -> tuple[str, ...]:
    """Every requirement id some scenario proves, sorted."""
    return tuple(sorted({r for s in load_scenarios() for r in s.requirements}))
