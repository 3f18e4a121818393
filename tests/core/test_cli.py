"""The ojs-retry command through click's CliRunner (issue 6; issue 2's schedule verb).

The group (help, plugins, never a traceback), ``validate`` and ``schedule``;
``test_cli_explain_migrate`` has the other two verbs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import types
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import click
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ojs_adapters import RetryPolicy
from tests.core.cli_support import assert_ojs_error, run, write

SPEC_53 = {"max_attempts": 7, "initial_interval": "PT10S", "backoff_coefficient": 2.0,
           "jitter": True}  # ojs-retry.md section 5.3, max_interval PT5M by default
VERBS = ("validate", "schedule", "explain", "migrate")


# -- help ----------------------------------------------------------------------------


@pytest.mark.parametrize("verb", VERBS)
def test_help_of_every_verb_shows_an_example(verb: str) -> None:
    result = run(verb, "--help")
    assert result.exit_code == 0
    assert "Example:" in result.output
    assert f"ojs-retry {verb}" in result.output


def test_group_help_lists_verbs_and_examples() -> None:
    result = run("--help")
    assert result.exit_code == 0
    for verb in VERBS:
        assert verb in result.output
    assert "Examples:" in result.output


# -- validate --------------------------------------------------------------------------


def test_validate_prints_the_effective_policy(tmp_path: Path) -> None:
    result = run("validate", write(tmp_path, {"max_attempts": 10}), "--json")
    assert result.exit_code == 0
    out = json.loads(result.output)
    assert out["ok"] and out["policy"]["max_attempts"] == 10
    assert out["policy"]["initial_interval"] == "PT1S"  # merged with the defaults (RET-10)


def test_validate_reads_yaml_from_stdin_and_job_envelopes() -> None:
    assert run("validate", "-", input="max_attempts: 2\njitter: false\n").exit_code == 0
    job = {"type": "email.send", "options": {"retry": {"max_attempts": 1,
                                                       "on_exhaustion": "dead_letter"}}}
    result = run("validate", "-", "--json", input=json.dumps(job))
    assert json.loads(result.output)["source"] == "options.retry"


@pytest.mark.parametrize(("policy", "field"), [
    ({"max_attempts": -1}, "max_attempts"),
    ({"initial_interval": "1S"}, "initial_interval"),
    ({"backoff_coefficient": 0.5}, "backoff_coefficient"),
    ({"initial_interval": "PT10S", "max_interval": "PT1S"}, "max_interval"),
    ({"max_attempts": True}, "max_attempts"),
    ({"retries": 3}, "retries"),
])
def test_validate_bad_policy_exits_1_with_code_field_rule(policy: dict[str, Any],
                                                          field: str) -> None:
    result = run("validate", "-", input=json.dumps(policy))
    assert_ojs_error(result, "INVALID_RETRY_POLICY", field)


def test_validate_bad_policy_as_json() -> None:
    result = run("validate", "-", "--json", input='{"max_attempts": -1}')
    assert result.exit_code == 1
    error = json.loads(result.stdout)["error"]
    assert error["code"] == "INVALID_RETRY_POLICY"
    assert error["details"]["field"] == "max_attempts"
    assert error["details"]["rule"] == "must be >= 0"


@pytest.mark.parametrize("text", ["{{{", "", "- [unclosed"])
def test_unparseable_input_is_an_invalid_payload(text: str) -> None:
    assert_ojs_error(run("validate", "-", input=text), "INVALID_PAYLOAD", "<stdin>")


def test_missing_file_is_an_invalid_payload(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.json")
    assert_ojs_error(run("schedule", missing), "INVALID_PAYLOAD", missing)
    binary = tmp_path / "policy.bin"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    assert_ojs_error(run("validate", str(binary)), "INVALID_PAYLOAD", str(binary))
    assert_ojs_error(run("validate", str(tmp_path)), "INVALID_PAYLOAD", str(tmp_path))


@settings(max_examples=30, deadline=None)
@given(attempts=st.integers(0, 50), initial=st.integers(1, 600), coefficient=st.floats(1, 5),
       strategy=st.sampled_from(["none", "linear", "exponential", "polynomial"]),
       jitter=st.booleans(), exhaust=st.sampled_from(["discard", "dead_letter"]))
def test_validate_round_trips_any_valid_policy(attempts: int, initial: int, coefficient: float,
                                              strategy: str, jitter: bool, exhaust: str) -> None:
    policy = RetryPolicy.from_dict({
        "max_attempts": attempts, "initial_interval": f"PT{initial}S",
        "max_interval": f"PT{initial * 10}S", "backoff_coefficient": round(coefficient, 3),
        "backoff_strategy": strategy, "jitter": jitter, "on_exhaustion": exhaust,
        "non_retryable_errors": ["auth.*"]})
    result = run("validate", "-", "--json", input=json.dumps(policy.to_dict()))
    assert RetryPolicy.from_dict(json.loads(result.output)["policy"]) == policy


# -- schedule --------------------------------------------------------------------------


def test_schedule_reproduces_the_spec_jitter_table(tmp_path: Path) -> None:
    result = run("schedule", write(tmp_path, SPEC_53), "--json")
    assert result.exit_code == 0
    rows = json.loads(result.output)["rows"]
    assert [r["attempt"] for r in rows] == [2, 3, 4, 5, 6, 7]
    assert [r["capped"] for r in rows] == [10, 20, 40, 80, 160, 300]
    assert [r["raw"] for r in rows][-1] == 320
    assert (rows[-1]["jitter_low"], rows[-1]["jitter_high"]) == (150, 300)
    assert rows[-1]["is_capped"] and not rows[0]["is_capped"]
    assert [r["cumulative"] for r in rows][-1] == 610


def test_schedule_table_has_every_column(tmp_path: Path) -> None:
    result = run("schedule", write(tmp_path, SPEC_53))
    assert result.exit_code == 0
    for header in ("Attempt", "Retry #", "Raw delay", "Capped delay", "Jitter band",
                   "Cumulative"):
        assert header in result.output
    assert "[2m 30s, 5m)" in result.output and "5m (capped)" in result.output


def test_schedule_limit_and_no_retry_policies() -> None:
    result = run("schedule", "-", "--limit", "2", input='{"max_attempts": 10}')
    assert "7 more retries" in result.output
    assert len(json.loads(run("schedule", "-", "--json", "--limit", "0",
                              input='{"max_attempts": 10}').output)["rows"]) == 9
    assert "no retries" in run("schedule", "-", input='{"max_attempts": 1}').output


def test_schedule_overflowing_raw_delay_is_shown_not_crashed() -> None:
    policy = {"max_attempts": 1200, "backoff_coefficient": 10, "max_interval": "PT1H"}
    result = run("schedule", "-", "--json", "--limit", "0", input=json.dumps(policy))
    assert result.exit_code == 0
    assert json.loads(result.output)["rows"][-1]["raw"] is None


def test_plot_without_matplotlib_is_a_clear_error(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real(name, *a))
    result = run("schedule", write(tmp_path, SPEC_53), "--plot", str(tmp_path / "x.png"))
    assert result.exit_code == 1
    assert "needs matplotlib" in result.output
    assert "Traceback" not in result.output


def test_plot_draws_the_band_with_matplotlib(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, Any]] = []

    class Axes:
        def __getattr__(self, name: str) -> Any:
            return lambda *args, **kwargs: calls.append((name, args))

    class Figure:
        def savefig(self, path: str, **_: Any) -> None:
            Path(path).write_bytes(b"png")

    pyplot = types.ModuleType("matplotlib.pyplot")
    pyplot.subplots = lambda **_: (Figure(), Axes())  # type: ignore[attr-defined]
    pyplot.close = lambda *_: None  # type: ignore[attr-defined]
    matplotlib = types.ModuleType("matplotlib")
    matplotlib.use = lambda *_: None  # type: ignore[attr-defined]
    matplotlib.__spec__ = importlib_spec("matplotlib")
    monkeypatch.setitem(sys.modules, "matplotlib", matplotlib)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", pyplot)
    out = tmp_path / "delays.png"
    result = run("schedule", write(tmp_path, SPEC_53), "--plot", str(out))
    assert result.exit_code == 0, result.output
    assert out.exists()
    band = next(args for name, args in calls if name == "fill_between")
    assert list(band[1]) == [5, 10, 20, 40, 80, 150]


def importlib_spec(name: str) -> Any:
    from importlib.machinery import ModuleSpec

    return ModuleSpec(name, loader=None)


# -- the plugin group ----------------------------------------------------------------------


@click.command("hello")
def hello_command() -> None:
    """Say hello (a test plugin)."""
    click.echo("hello from a plugin")


def fake_plugins(monkeypatch: pytest.MonkeyPatch, **values: str) -> None:
    eps = [EntryPoint(name=name, value=value, group="ojs_adapters.cli")
           for name, value in values.items()]
    monkeypatch.setattr("ojs_adapters.cli._group.entry_points",
                        lambda group: [ep for ep in eps if ep.group == group])


def test_plugins_are_listed_without_import_and_run_on_demand(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fake_plugins(monkeypatch, hello="tests.core.test_cli:hello_command",
                 ghost="no_such_module_ojs:command", validate="no_such_module_ojs:command")
    listing = run("--help")
    assert "hello" in listing.output and "ghost" in listing.output
    assert "no_such_module_ojs" not in sys.modules
    assert run("hello").output == "hello from a plugin\n"
    broken = run("ghost")
    assert broken.exit_code == 1
    assert "'ghost' cannot run here: ModuleNotFoundError: No module named " \
        "'no_such_module_ojs'" in broken.output  # its own module: broken, not an extra


def test_a_verb_whose_extra_is_not_installed_names_the_extra() -> None:
    """``ojs-retry web`` without the web extra: what to install, not "broken plugin"."""
    code = ("import sys; sys.modules['starlette'] = None; from ojs_adapters.cli import main; "
            "sys.argv = ['ojs-retry', 'web']; main()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 1
    assert "'web' cannot run here: it needs starlette, which is not installed: " \
        "pip install 'ojs-adapters[web]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_extra_named_is_the_verb_s_own_when_several_list_the_module() -> None:
    from ojs_adapters.cli._group import _not_installed

    dist = types.SimpleNamespace(name="ojs-adapters", requires=[
        "prometheus-client>=0.17; extra == 'dev'", "prometheus-client>=0.17; extra == 'metrics'",
        "prometheus-client>=0.17; extra == 'web'", "starlette>=1.7; extra == \"web\""])
    web = types.SimpleNamespace(name="web", value="ojs_adapters.web._cmd:command", dist=dist)
    assert _not_installed(web, "prometheus_client.core").endswith(  # type: ignore[arg-type]
        "it needs prometheus_client, which is not installed: pip install 'ojs-adapters[web]'")
    other = types.SimpleNamespace(name="stats", value="x:y", dist=dist)
    assert _not_installed(other, "prometheus_client").endswith(  # type: ignore[arg-type]
        "'ojs-adapters[metrics]'")
    assert _not_installed(web, "leftpad") == "it needs leftpad, which is not installed"  # type: ignore[arg-type]


def test_a_verb_missing_a_module_of_its_own_package_is_broken_not_uninstalled(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fake_plugins(monkeypatch, mine="tests.core.no_such_module_ojs:command")
    broken = run("mine")
    assert broken.exit_code == 1
    assert "No module named 'tests.core.no_such_module_ojs'" in broken.output
    assert "not installed" not in broken.output
    # A plugin cannot shadow a built-in verb.
    assert run("validate", "-", input="{}").exit_code == 0


# -- never a traceback ---------------------------------------------------------------------

KEYS = ["max_attempts", "initial_interval", "backoff_coefficient", "max_interval", "jitter",
        "non_retryable_errors", "on_exhaustion", "backoff_strategy", "retry", "dead",
        "retry_for", "sidekiq_retry_in", "max_retries", "min_backoff", "max_backoff", "throws",
        "retry_when", "autoretry_for", "retry_backoff", "retry_backoff_max", "retry_jitter",
        "retry_kwargs", "default_retry_delay", "attempts", "backoff", "removeOnFail",
        "initialInterval", "maximumAttempts", "maximumInterval", "backoffCoefficient",
        "nonRetryableErrorTypes", "MaxRetries", "RetryBackoffBaseMS", "RetryBackoffMaxMS",
        "type", "delay", "options"]
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10, 10**6),
                    st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from(["PT1S", "1s", ":kill", "discard", "3.days", "", "x",
                                     "exponential", "fixed", "dead_letter", "-1"]))
DOCUMENTS = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(KEYS), inner, max_size=5)),
    max_leaves=12)


@settings(max_examples=150, deadline=None)
@given(doc=DOCUMENTS, verb=st.sampled_from(
    ["validate", "schedule", "explain", "sidekiq", "faktory", "celery", "dramatiq", "bullmq",
     "temporal", "queue"]))
def test_no_input_gives_a_traceback(doc: Any, verb: str) -> None:
    text = json.dumps(doc)
    if verb == "explain":
        args = ["explain", "-", "--error", "x.y", "--attempt", "2", "--json"]
    elif verb in ("validate", "schedule"):
        args = [verb, "-", "--json"]
    else:
        args = ["migrate", "--from", verb, "-", "--json"]
    result = run(*args, input=text)
    assert result.exit_code in (0, 1, 3), (args, text, result.output)
    assert "Traceback" not in result.output
    json.loads(result.stdout)  # --json always prints one JSON document
