"""The suite catches a broken adapter: each mutation makes some scenario fail (issue 5).

The mutations break what the adapters rely on, in process, on the embedded
brokers: an off-by-one ``max_attempts``, the cap not applied after jitter, and
a prefix match that takes ``auth`` for ``auth.*``. The expectations in
``scenarios.yaml`` are literal data, so the suite does not share the bug.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

import ojs_adapters.backoff as backoff_module
import ojs_adapters.policy as policy_module
from conformance.drivers import get_driver
from conformance.runner import run_suite
from conformance.scenarios import load_scenarios
from ojs_adapters import RetryPolicy


@pytest.fixture(autouse=True)
def fresh_policy_cache() -> Iterator[None]:
    policy_module._cached_build.cache_clear()
    yield
    policy_module._cached_build.cache_clear()


def off_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    build = policy_module._build

    def mutant(data: Any, base: Any) -> RetryPolicy:
        good = build(data, base)
        return RetryPolicy(**{**{f: getattr(good, f) for f in (
            "initial_interval", "backoff_coefficient", "max_interval", "jitter",
            "non_retryable_errors", "on_exhaustion", "backoff_strategy", "jitter_mode",
            "max_duration")}, "max_attempts": good.max_attempts + 1})

    monkeypatch.setattr(policy_module, "_build", mutant)


def no_cap_after_jitter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backoff_module, "final_delay",
                        lambda capped, cap, u: capped * (0.5 + u))


def bare_prefix_matches(monkeypatch: pytest.MonkeyPatch) -> None:
    original = RetryPolicy._first_match

    def mutant(self: RetryPolicy, names: tuple[str, ...]) -> str | None:
        for name in names:
            for prefix in self._prefixes:
                if name == prefix[:-1]:
                    return prefix + "*"
        return original(self, names)

    monkeypatch.setattr(RetryPolicy, "_first_match", mutant)


MUTATIONS: dict[str, tuple[Callable[[pytest.MonkeyPatch], None], str]] = {
    "off-by-one max_attempts": (off_by_one, "exhaustion-dead-letters"),
    "cap not applied after jitter": (no_cap_after_jitter, "exponential-cap-and-jitter-cap"),
    "auth matches auth.*": (bare_prefix_matches, "prefix-does-not-match-its-bare-name"),
}


@pytest.mark.parametrize("framework", ["celery", "dramatiq"])
@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_the_suite_catches_the_mutation(framework: str, mutation: str,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    mutate, scenario_id = MUTATIONS[mutation]
    scenarios = tuple(s for s in load_scenarios() if s.id == scenario_id)
    healthy = run_suite(get_driver(framework), "memory", scenarios, timeout=20)
    assert [r.status for r in healthy] == ["pass"], healthy[0].problems
    mutate(monkeypatch)
    policy_module._cached_build.cache_clear()  # policies built while healthy must not survive
    broken = run_suite(get_driver(framework), "memory", scenarios, timeout=20)
    assert [r.status for r in broken] == ["fail"], f"{mutation} went unnoticed"
