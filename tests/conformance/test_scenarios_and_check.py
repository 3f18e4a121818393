"""The conformance scenarios are well-formed, cover section 15, and ``check`` catches deviations."""

from __future__ import annotations

from typing import Any

import pytest

from conformance.check import check
from conformance.driver import Observation
from conformance.report import broker_label, cell, markdown
from conformance.runner import ScenarioResult, requirement_matrix
from conformance.scenarios import load_scenarios, parse_scenario, requirements_covered

#: MUSTs of ojs-retry.md section 15 a job-queue adapter cannot prove with a scenario,
#: with the reason (also in the README).
NOT_SCENARIO_TESTABLE = {
    "RET-13": "heartbeat extension of a reservation: proved by the fault tests of issue 8",
}


def test_scenarios_load_with_unique_ids() -> None:
    scenarios = load_scenarios()
    assert len(scenarios) >= 20
    assert len({s.id for s in scenarios}) == len(scenarios)


def test_every_section_15_must_and_err_011_012_is_covered() -> None:
    wanted = {f"RET-{n:02d}" for n in range(1, 21)} | {"ERR-011", "ERR-012"}
    assert wanted - set(requirements_covered()) == set(NOT_SCENARIO_TESTABLE)


def test_bad_scenarios_are_refused_with_a_reason() -> None:
    base: dict[str, Any] = {"id": "x", "requirements": ["RET-01"], "script": ["succeed"],
                            "expect": {"attempts": 1}}
    for change, words in [({"script": []}, "script"), ({"expect": {"nope": 1}}, "expect"),
                          ({"script": [{"explode": 1}]}, "step"), ({"needs": ["gpu"]}, "needs"),
                          ({"requirements": []}, "requirements"), ({"extra": 1}, "unknown")]:
        with pytest.raises(ValueError, match=words):
            parse_scenario({**base, **change})


def scenario(sid: str) -> Any:
    return next(s for s in load_scenarios() if s.id == sid)


def good_record(**changes: Any) -> dict[str, Any]:
    record = {
        "state": "discarded", "outcome": "dead_letter", "dead_lettered": True,
        "countdowns": [0.1, 0.2],
        "errors": [{"attempt": n, "code": "HANDLER_ERROR", "type": "ValueError",
                    "message": "m", "occurred_at": "2026-01-01T00:00:00.000Z"}
                   for n in (1, 2, 3)],
    }
    record.update(changes)
    return record


def observe(**changes: Any) -> Observation:
    fields: dict[str, Any] = {"scenario_id": "exhaustion-dead-letters", "job_id": "j",
                              "starts": (0.0, 0.15, 0.40), "record": good_record(),
                              "in_dead_letter_queue": True}
    fields.update(changes)
    return Observation(**fields)


def test_check_passes_a_faithful_run() -> None:
    assert check(scenario("exhaustion-dead-letters"), observe()) == []


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"starts": (0.0, 0.15, 0.40, 0.9)}, "ran 4 time"),
        ({"record": good_record(countdowns=[0.1, 0.3])}, "countdowns"),
        ({"starts": (0.0, 0.05, 0.40)}, "RET-11"),
        ({"starts": (0.0, 0.15, 9.0)}, "late"),
        ({"in_dead_letter_queue": False}, "is not in the dead-letter queue"),
        ({"record": good_record(outcome="discarded")}, "outcome"),
        ({"record": good_record(errors=[])}, "history has 0 entries"),
        ({"record": None}, "no job record"),
        ({"rejected": "INVALID_RETRY_POLICY"}, "refused"),
    ],
)
def test_check_names_each_deviation(changes: dict[str, Any], words: str) -> None:
    problems = check(scenario("exhaustion-dead-letters"), observe(**changes))
    assert any(words in p for p in problems), problems


def test_check_requires_err_012_fields() -> None:
    record = good_record()
    del record["errors"][0]["occurred_at"]
    assert any("ERR-012" in p for p in check(scenario("exhaustion-dead-letters"),
                                             observe(record=record)))


def test_rejected_scenarios_pass_only_when_refused_and_never_run() -> None:
    s = scenario("invalid-duration-rejected-at-enqueue")
    ok = Observation(s.id, None, rejected="INVALID_RETRY_POLICY")
    assert check(s, ok) == []
    assert check(s, Observation(s.id, "j", starts=(1.0,)))


def test_matrix_and_markdown() -> None:
    a, b = scenario("handler-fail"), scenario("worker-crash-consumes-one-attempt")
    results = [ScenarioResult(a, "pass"), ScenarioResult(b, "n/a", ("driver cannot: crash",))]
    assert requirement_matrix(results) == {"RET-08": "pass", "RET-12": "n/a"}
    results.append(ScenarioResult(scenario("history-keeps-ten-newest"), "fail", ("x",)))
    md = markdown([cell("celery", "redis://u:secret@127.0.0.1:6379/0", results)])
    assert "| RET-15 | FAIL |" in md and "secret" not in md
    assert broker_label("amqp://guest:guest@127.0.0.1:5672//") == "amqp://127.0.0.1:5672//"
