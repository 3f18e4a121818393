"""The ojs-retry command's ``explain`` and ``migrate`` verbs through click's CliRunner (issue 6).

``test_cli`` has the group, ``validate`` and ``schedule``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tests.core.cli_support import assert_ojs_error, run, write

# -- explain ---------------------------------------------------------------------------

POLICY_124 = {"max_attempts": 5, "initial_interval": "PT30S", "max_interval": "PT15M",
              "non_retryable_errors": ["auth.*", "resource.not_found"],
              "on_exhaustion": "dead_letter"}  # ojs-retry.md section 12.4


def explain(tmp_path: Path, *args: str) -> dict[str, Any]:
    result = run("explain", write(tmp_path, POLICY_124), "--json", *args)
    assert result.exit_code == 0, result.output
    out: dict[str, Any] = json.loads(result.output)
    return out


def test_explain_non_retryable_prefix_goes_to_dead_letter(tmp_path: Path) -> None:
    out = explain(tmp_path, "--error", "auth.invalid_credentials", "--attempt", "1")
    assert (out["action"], out["reason"], out["matched"]) == \
        ("dead_letter", "non_retryable", "auth.*")
    assert out["entry"]["code"] == "NON_RETRYABLE_ERROR"


def test_explain_retry_shows_delay_and_band(tmp_path: Path) -> None:
    out = explain(tmp_path, "--error", "external.crm.service_unavailable", "--attempt", "2")
    assert (out["action"], out["next_attempt"], out["delay"]) == ("retry", 3, 60.0)
    assert out["jitter_band"] == [30.0, 90.0]
    assert any("retried as attempt 3" in line for line in out["explanation"])


def test_explain_handler_code_and_exhaustion_and_worker_lost(tmp_path: Path) -> None:
    assert explain(tmp_path, "--error", "x", "--code", "discard", "--attempt", "1")["action"] \
        == "discard"
    assert explain(tmp_path, "--error", "x", "--attempt", "5")["reason"] == "exhausted"
    lost = explain(tmp_path, "--error", "auth.x", "--worker-lost", "--attempt", "1")
    assert lost["action"] == "retry"  # section 9.2: a lost worker is always retryable


def test_explain_base_class_names_match(tmp_path: Path) -> None:
    policy = write(tmp_path, {"non_retryable_errors": ["myapp.PaymentError"]})
    result = run("explain", policy, "--error", "myapp.CardStolen", "--base",
                 "myapp.PaymentError", "--attempt", "1")
    assert result.exit_code == 0 and "DISCARD" in result.output


def test_explain_bad_attempt_is_an_ojs_error(tmp_path: Path) -> None:
    result = run("explain", write(tmp_path, POLICY_124), "--error", "x", "--attempt", "0")
    assert_ojs_error(result, "INVALID_ARGS", "attempt")


# -- migrate ---------------------------------------------------------------------------


def test_migrate_each_dialect_from_stdin() -> None:
    cases = {"sidekiq": ("{retry: 0}", 1), "faktory": ('{"retry": -1}', 1),
             "celery": ("{max_retries: 2, autoretry_for: [Exception]}", 3),
             "dramatiq": ("max_retries: 1", 2),
             "bullmq": ("attempts: 3", 3), "queue": ("MaxRetries: 3", 4),
             "temporal": ("maximumAttempts: 4", 4)}
    for dialect, (text, attempts) in cases.items():
        result = run("migrate", "--from", dialect, "-", "--json", input=text)
        assert result.exit_code == 0, (dialect, result.output)
        [m] = json.loads(result.output)["migrations"]
        assert m["policy"]["max_attempts"] == attempts


def test_migrate_prints_policy_notes_and_fidelity(tmp_path: Path) -> None:
    (tmp_path / "hard_job.rb").write_text("class HardJob\n  sidekiq_options retry: 5\nend\n")
    result = run("migrate", "--from", "sidekiq", str(tmp_path), "--version", "7.3", "--rows")
    assert result.exit_code == 0, result.output
    assert '"max_attempts": 6' in result.output
    assert "fidelity: worst ratio" in result.output
    # the two expected delays beside their ratio: a small ratio may be seconds apart
    assert re.search(r"worst ratio \S+ \(new/old expected delay: \S+ for \S+\) at retry \d",
                     result.output)
    assert "approximate: retry:" in result.output
    assert "Old delay" in result.output
    assert "verdict: ok" in result.output  # every retry within 1.5x, the first after 16 s


def test_migrate_verdict_flags_early_retries_much_sooner() -> None:
    """Sidekiq's 25 retries: the closest schedule within tolerance still retries first after
    1.76 s where Sidekiq waits 19.5 s. Under a minute off, so not lossy (exit 0, ok), but
    not 'ok' either: 'approximate', with the numbers, in the verdict line and the JSON."""
    result = run("migrate", "--from", "sidekiq", "-", "--version", "8.1", input="retry: 25")
    assert result.exit_code == 0, result.output
    assert ("verdict: approximate: retry 1 comes more than 2.5x sooner than the source's: "
            "1.76s where it waits 19.5s (0.09x)") in " ".join(result.output.split())
    result = run("migrate", "--from", "sidekiq", "-", "--version", "8.1", "--json",
                 input="retry: 25")
    [m] = json.loads(result.output)["migrations"]
    assert (m["ok"], m["verdict"], m["fidelity"]["hurried"]) == (True, "approximate", [1])
    assert any(n["severity"] == "approximate" and "2.5x sooner" in n["text"]
               for n in m["notes"])
    result = run("migrate", "--from", "sidekiq", "-", "--json", input="retry: 5")
    [m] = json.loads(result.output)["migrations"]
    assert (m["ok"], m["verdict"], m["fidelity"]["hurried"]) == (True, "ok", [])


def test_app_wide_defaults_take_the_apps_max_retries_and_are_counted_apart(
        tmp_path: Path) -> None:
    """The trial's layout: sidekiq.yml sets :max_retries: 8, an initializer sets
    Sidekiq.default_job_options. That row, the app's default for a job with no options,
    said 'Sidekiq's default of 25 retries' where the jobs got 8; every job repeated
    'Sidekiq-wide: backtrace' (not a retry setting); the summary counted the two app-wide
    rows as jobs."""
    (tmp_path / "app" / "jobs").mkdir(parents=True)
    (tmp_path / "config" / "initializers").mkdir(parents=True)
    (tmp_path / "config" / "sidekiq.yml").write_text(
        "---\n:concurrency: 5\n:max_retries: 8\n:queues:\n  - default\n")
    (tmp_path / "config" / "initializers" / "sidekiq.rb").write_text(
        "Sidekiq.default_job_options = { 'backtrace' => true }\n")
    (tmp_path / "app" / "jobs" / "jobs.rb").write_text(
        "class PlainJob\n  include Sidekiq::Job\nend\n"
        "class FiveJob\n  include Sidekiq::Job\n  sidekiq_options retry: 5\nend\n"
        "class CodeJob\n  include Sidekiq::Job\n  sidekiq_retry_in { |c, e| e.wait }\nend\n")
    sources = (str(tmp_path / "app"), str(tmp_path / "config"))
    result = run("migrate", "--from", "sidekiq", *sources, "--json")
    found = {m["name"]: m for m in json.loads(result.output)["migrations"]}
    wide = found["Sidekiq.default_job_options"]
    assert wide["policy"]["max_attempts"] == 9 and wide["app_wide"] is True
    assert found["Sidekiq[:max_retries]"]["app_wide"] is True
    said = [n["text"] for n in wide["notes"]]
    assert any("Sidekiq-wide: max_retries from Sidekiq[:max_retries]" in t
               and t.endswith("sidekiq.yml:3)") for t in said)
    assert "not set: the app's max_retries of 8 retries (9 attempts)" in " ".join(said)
    assert sum("backtrace" in t for t in said) == 1  # said once, on its own row
    for name in ("PlainJob", "FiveJob", "CodeJob"):
        assert found[name]["app_wide"] is False
        assert not any("backtrace" in n["text"] for n in found[name]["notes"]), name
    assert found["PlainJob"]["policy"]["max_attempts"] == 9
    assert any("max_retries from" in n["text"] for n in found["PlainJob"]["notes"])
    assert not any("max_retries" in n["text"] for n in found["FiveJob"]["notes"])  # retry: 5
    human = run("migrate", "--from", "sidekiq", *sources)
    assert human.exit_code == 3  # CodeJob's block is code
    assert "3 jobs, 2 app-wide defaults migrated: 1 lossy" in human.output


def test_an_app_wide_retry_count_is_not_said_to_take_max_retries(tmp_path: Path) -> None:
    """default_job_options sets retry: 5 beside :max_retries in sidekiq.yml: Sidekiq reads
    max_retries only for retry: true, so the jobs get 5 retries (right) and their notes
    said they took max_retries (wrong); a production: section's row pointed at the
    section's line, not its max_retries; 0 retries said "(1 attempts)"."""
    (tmp_path / "app").mkdir()
    (tmp_path / "config" / "initializers").mkdir(parents=True)
    (tmp_path / "config" / "sidekiq.yml").write_text(
        ":max_retries: 10\nproduction:\n  :concurrency: 10\n  :max_retries: 0\n")
    (tmp_path / "config" / "initializers" / "sidekiq.rb").write_text(
        "Sidekiq.default_job_options = { 'retry' => 5 }\n")
    (tmp_path / "app" / "jobs.rb").write_text("class PlainJob\n  include Sidekiq::Job\nend\n")
    sources = (str(tmp_path / "app"), str(tmp_path / "config"))
    result = run("migrate", "--from", "sidekiq", *sources, "--json")
    found = {m["name"]: m for m in json.loads(result.output)["migrations"]}
    for name in ("PlainJob", "Sidekiq.default_job_options"):
        assert found[name]["policy"]["max_attempts"] == 6, name
        assert not any("max_retries" in n["text"] for n in found[name]["notes"]), name
    count = found["Sidekiq[:max_retries]"]
    assert count["origin"].endswith("sidekiq.yml:4")
    assert any(n["text"].endswith("of 0 retries (1 attempt)") for n in count["notes"])


def test_migrate_reads_app_and_config_as_one_run(tmp_path: Path) -> None:
    """docs/migration.md: point the command at ``app/`` and ``config/``; the app's defaults
    in ``config/`` apply to the jobs in ``app/``, and a file named twice counts once."""
    (tmp_path / "app" / "jobs").mkdir(parents=True)
    (tmp_path / "config" / "initializers").mkdir(parents=True)
    (tmp_path / "app" / "jobs" / "hard_job.rb").write_text(
        "class HardJob\n  include Sidekiq::Job\nend\n")
    (tmp_path / "config" / "initializers" / "sidekiq.rb").write_text(
        'Sidekiq.default_job_options = { "retry" => 3 }\n')
    app, config = str(tmp_path / "app"), str(tmp_path / "config")
    both = run("migrate", "--from", "sidekiq", app, config, app + "/jobs/hard_job.rb", "--json")
    assert both.exit_code == 0, both.output
    migrations = json.loads(both.output)["migrations"]
    assert sorted(m["name"] for m in migrations) == ["HardJob", "Sidekiq.default_job_options"]
    found = {m["name"]: m for m in migrations}
    assert found["HardJob"]["policy"]["max_attempts"] == 4  # Sidekiq's 25 without config/
    alone = run("migrate", "--from", "sidekiq", app, "--json")
    assert json.loads(alone.output)["migrations"][0]["policy"]["max_attempts"] == 26
    mixed = run("migrate", "--from", "sidekiq", app, "-")
    assert mixed.exit_code == 2 and "- (stdin) cannot be read with files" in mixed.output


def test_migrate_unbounded_celery_exits_3_and_is_not_capped() -> None:
    result = run("migrate", "--from", "celery", "-", "--json", input="max_retries: null")
    assert result.exit_code == 3
    out = json.loads(result.output)
    assert out["ok"] is False and out["migrations"][0]["policy"] is None
    capped = run("migrate", "--from", "celery", "-", "--cap-unbounded", "9", "--json",
                 input="{max_retries: null, autoretry_for: [Exception]}")
    assert capped.exit_code == 0
    assert json.loads(capped.output)["migrations"][0]["policy"]["max_attempts"] == 9


def test_migrate_ruby_from_stdin() -> None:
    result = run("migrate", "--from", "sidekiq", "-", "--ruby", "--json",
                 input="class A\n  sidekiq_options retry: false\nend\n")
    [m] = json.loads(result.output)["migrations"]
    assert (m["name"], m["policy"]["on_exhaustion"]) == ("A", "discard")


def test_migrate_bad_input_exits_1_with_the_ojs_error() -> None:
    result = run("migrate", "--from", "sidekiq", "-", input="retry: often")
    assert_ojs_error(result, "INVALID_RETRY_POLICY", "retry")
    assert "dialect: sidekiq" in result.stderr
    empty = run("migrate", "--from", "sidekiq", "-", "--ruby", input="puts 1\n")
    assert_ojs_error(empty, "INVALID_PAYLOAD", "-")
    assert run("migrate", "--from", "resque", "-", input="{}").exit_code == 2
    assert run("migrate", "--from", "celery", "--version", "5", "-", input="{}").exit_code == 2
    assert run("migrate", "--from", "bullmq", "--cap-unbounded", "3", "-",
               input="{}").exit_code == 2


def test_a_dramatiq_scan_takes_only_actor_options(tmp_path: Path) -> None:
    """docs/migration.md (Dramatiq input): a directory scan takes a file of actor options,
    and passes over JSON that merely holds ``throws`` (it was read as an actor); with
    nothing taken it says what it passed over and why."""
    (tmp_path / "lint").mkdir()
    write(tmp_path / "lint", {"name": "no-throw", "throws": True, "description": "a rule"},
          "rule.json")
    write(tmp_path / "lint", {"throws": ["ValueError"], "docs": "https://example.com"},
          "api.json")
    passed = run("migrate", "--from", "dramatiq", str(tmp_path / "lint"))
    assert_ojs_error(passed, "INVALID_PAYLOAD", str(tmp_path / "lint"))
    assert f"no dramatiq retry settings found in {tmp_path / 'lint'}; passed over: " \
           f"{tmp_path / 'lint' / 'api.json'} (key 'docs' is not a Dramatiq actor option); " \
           f"{tmp_path / 'lint' / 'rule.json'} (no-throw: key 'description' is not a " \
           "Dramatiq actor option)" in " ".join(passed.stderr.split())
    write(tmp_path / "lint", {"charge": {"max_retries": 3, "min_backoff": 1000,
                                         "throws": ["billing.CardDeclined"],
                                         "queue_name": "billing"},
                              "send_email": {"actor_name": "send_email"}}, "actors.json")
    taken = run("migrate", "--from", "dramatiq", str(tmp_path / "lint"), "--json")
    assert taken.exit_code == 0, taken.output
    migrations = json.loads(taken.output)["migrations"]
    assert [(m["name"], m["policy"]["max_attempts"]) for m in migrations] == [
        ("charge", 4), ("send_email", 21)]
    assert migrations[0]["policy"]["non_retryable_errors"] == ["billing.CardDeclined"]
    named = run("migrate", "--from", "dramatiq", str(tmp_path / "lint" / "api.json"), "--json")
    assert named.exit_code == 0, named.output  # a file named on purpose is read as given
