"""An honest ``ojs-retry migrate`` (issue 16, item 8): a lossy translation exits non-zero.

One lossy input per dialect: the command exits 3 with ``"ok": false``, the job is
marked ``lossy`` and a ``lossy`` note names what is lost; ``--allow-lossy`` accepts
it (exit 0, the notes unchanged). The Sidekiq cases of the issue: ``:kill`` for an
error class, a custom ``sidekiq_retry_in`` formula, and the default formula.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner, Result

from ojs_adapters.cli import main

#: dialect -> (a lossy input, the field of the lossy note; None: the schedule as a whole)
LOSSY: dict[str, tuple[str, str | None]] = {
    # A sidekiq_retry_in that is code: not evaluated, the default formula assumed.
    "sidekiq": ("class ChargeJob\n  sidekiq_options retry: 5\n"
                "  sidekiq_retry_in do |count, exception|\n"
                "    exception.respond_to?(:wait) ? exception.wait : 60\n  end\nend\n",
                "sidekiq_retry_in"),
    # 300 retries of count**4: delays past the longest max_interval a policy can say.
    "faktory": ('{"retry": 300}', None),
    # An allow-list of errors to retry: OJS retries everything not non-retryable.
    "celery": ('{"autoretry_for": ["requests.exceptions.ConnectionError"]}', "autoretry_for"),
    # An actor to notify on exhaustion is not part of a policy.
    "dramatiq": ('{"max_retries": 3, "on_retry_exhausted": "notify_admins"}',
                 "on_retry_exhausted"),
    # A delay of 2,700 years: longer than a policy can say.
    "bullmq": ('{"attempts": 3, "backoff": 8.64e16}', "backoff.delay"),
    # A time limit over all attempts: a policy limits attempts only.
    "temporal": ('{"maximumAttempts": 5, "scheduleToCloseTimeout": "1h"}',
                 "scheduleToCloseTimeout"),
    "queue": ('{"MaxRetries": 2, "RetryBackoffBaseMS": 10000000000000, '
              '"RetryBackoffMaxMS": 10000000000000}', "RetryBackoffBaseMS"),
}


def run(*args: str, input: str) -> Result:
    return CliRunner().invoke(main, ["migrate", *args], input=input)


def migrate_json(dialect: str, text: str, *extra: str) -> tuple[int, dict[str, Any]]:
    ruby = ["--ruby"] if text.startswith("class ") else []
    result = run("--from", dialect, "-", "--json", *ruby, *extra, input=text)
    return result.exit_code, json.loads(result.stdout)


@pytest.mark.parametrize("dialect", sorted(LOSSY))
def test_a_lossy_translation_exits_3_with_ok_false_and_the_note(dialect: str) -> None:
    text, field = LOSSY[dialect]
    code, out = migrate_json(dialect, text)
    assert code == 3, out
    assert out["ok"] is False and out["allow_lossy"] is False
    [m] = out["migrations"]
    assert m["policy"] is not None  # a policy is proposed, but not as a success
    assert m["lossy"] is True and m["ok"] is False
    lossy = [n for n in m["notes"] if n["severity"] == "lossy" and not n["asked"]]
    assert any(n["field"] == field for n in lossy), lossy


@pytest.mark.parametrize("dialect", sorted(LOSSY))
def test_allow_lossy_accepts_it_and_keeps_the_notes(dialect: str) -> None:
    text, field = LOSSY[dialect]
    code, out = migrate_json(dialect, text, "--allow-lossy")
    assert code == 0 and out["ok"] is True and out["allow_lossy"] is True
    [m] = out["migrations"]
    assert m["lossy"] is True and m["ok"] is False  # the job's own verdict does not change
    assert any(n["severity"] == "lossy" and n["field"] == field for n in m["notes"])


def test_the_human_output_says_lossy_and_how_to_accept() -> None:
    text, _ = LOSSY["celery"]
    result = run("--from", "celery", "-", input=text)
    assert result.exit_code == 3
    assert "lossy: autoretry_for:" in result.stdout
    assert "verdict: LOSSY" in result.stdout
    assert "1 lossy (pass --allow-lossy to accept)" in result.stderr
    accepted = run("--from", "celery", "-", "--allow-lossy", input=text)
    assert accepted.exit_code == 0 and "accepted: --allow-lossy" in accepted.stderr


def test_no_policy_still_exits_3_with_allow_lossy() -> None:
    code, out = migrate_json("celery", "max_retries: null", "--allow-lossy")
    assert code == 3 and out["ok"] is False


def test_an_asked_cap_is_noted_but_does_not_fail() -> None:
    code, out = migrate_json("temporal", '{"maximumAttempts": 0}', "--cap-unbounded", "9")
    assert code == 0 and out["ok"] is True
    [note] = [n for n in out["migrations"][0]["notes"] if n["severity"] == "lossy"]
    assert note["asked"] is True and note["field"] == "maximumAttempts"


def test_a_schedule_that_is_not_kept_is_lossy() -> None:
    """Fidelity is judged retry by retry: a block alternating 1 s and 601 s has no OJS
    shape; the fit keeps the window, but half the retries are far off."""
    code, out = migrate_json("sidekiq", '{"retry": 10, "sidekiq_retry_in": '
                             '"count % 2 * 600 + 1"}', "--version", "6.0")
    assert code == 3
    [m] = out["migrations"]
    assert m["fidelity"]["faithful"] is False
    assert m["fidelity"]["window_ratio"] == pytest.approx(1.0, abs=0.01)
    assert any(n["severity"] == "lossy" and n["text"].startswith("the schedule is not kept")
               for n in m["notes"])


def test_sidekiqs_random_term_on_a_block_is_kept_in_the_fit() -> None:
    """Since 6.2.2 Sidekiq adds rand(10 * (count + 1)) to a block's delay (8.x): for
    ``10 * (count + 1)`` the block alone is a third short of the window, so the policy is
    fitted to the expected sum, not called exact and then lossy."""
    for version, retries in (("8.1", 10), ("7.3", 10), ("8.1", 25)):
        code, out = migrate_json("sidekiq", f'{{"retry": {retries}, "sidekiq_retry_in": '
                                 '"10 * (count + 1)"}', "--version", version)
        assert code == 0, out
        [m] = out["migrations"]
        assert m["fidelity"]["faithful"] is True
        assert m["fidelity"]["window_ratio"] == pytest.approx(1.0, abs=0.05)
        assert any("Sidekiq adds to it (since 6.2.2" in n["text"] for n in m["notes"])
    code, out = migrate_json("sidekiq", '{"sidekiq_retry_in": 30}', "--version", "8.1")
    assert code == 0, out  # a constant 30 s under a random term growing to 250 s: refitted
    code, out = migrate_json("sidekiq", '{"sidekiq_retry_in": "30 * (count + 1)"}',
                             "--version", "8.1")
    [m] = out["migrations"]  # 30 s * n plus 5 s * n - 0.5 s on average
    assert m["policy"]["initial_interval"] == "PT34.819S" and code == 0
    code, out = migrate_json("sidekiq", '{"retry": 10, "sidekiq_retry_in": '
                             '"count % 2 * 600 + 5"}', "--version", "8.1")
    [m] = out["migrations"]  # lost by its shape, random term or not
    assert code == 3


# -- the Sidekiq cases of the issue ------------------------------------------------------

CARD = """class ChargeJob
  include Sidekiq::Job
  sidekiq_retry_in do |count, exception|
    case exception
    when Stripe::CardError then :kill
    else 30 * (count + 1)
    end
  end
end
"""


def test_kill_for_an_error_class_becomes_non_retryable_and_the_formula_is_kept() -> None:
    code, out = migrate_json("sidekiq", CARD, "--version", "8.1")
    assert code == 0, out
    [m] = out["migrations"]
    policy = m["policy"]
    # :kill sends the job to the dead set at once: non-retryable, on_exhaustion dead_letter.
    assert policy["non_retryable_errors"] == ["Stripe::CardError"]
    assert policy["on_exhaustion"] == "dead_letter"
    # 30 * (count + 1) plus Sidekiq's random term, 5 * (count + 1) - 0.5 s on average: linear.
    assert (policy["backoff_strategy"], policy["initial_interval"]) == ("linear", "PT34.819S")
    assert policy["max_attempts"] == 26
    assert any("30 * (count + 1) plus the rand(10 * (count + 1)) Sidekiq adds" in n["text"]
               for n in m["notes"])
    assert m["ok"] is True and m["lossy"] is False


def test_discard_for_an_error_class_is_a_handler_code_or_non_retryable() -> None:
    block = CARD.replace(":kill", ":discard")
    _, out = migrate_json("sidekiq", block)
    [m] = out["migrations"]
    assert m["handler_codes"] == {"Stripe::CardError": "DISCARD"}
    assert m["policy"]["non_retryable_errors"] == []
    kept_out = block.replace("include Sidekiq::Job", "sidekiq_options dead: false")
    _, out = migrate_json("sidekiq", kept_out)
    [m] = out["migrations"]
    assert m["policy"]["non_retryable_errors"] == ["Stripe::CardError"]
    assert m["policy"]["on_exhaustion"] == "discard"


def test_a_custom_formula_is_fitted_and_its_error_stated() -> None:
    code, out = migrate_json("sidekiq", '{"sidekiq_retry_in": "count ** 2 * 60"}')
    [m] = out["migrations"]
    assert code == 0 and m["policy"]["backoff_strategy"] == "polynomial"
    [fit] = [n for n in m["notes"] if "mean fitted as polynomial" in n["text"]]
    assert "worst per-retry ratio" in fit["text"] and "total window" in fit["text"]
    # count 0 gives 0 s, so Sidekiq uses its default formula there; the fit says so.
    assert any("before retry 1" in n["text"] for n in m["notes"])


def test_the_default_formula_keeps_sidekiqs_20_day_window_within_tolerance() -> None:
    code, out = migrate_json("sidekiq", "retry: true", "--version", "8.1")
    assert code == 0
    [m] = out["migrations"]
    assert m["policy"]["backoff_strategy"] == "polynomial"
    fidelity = m["fidelity"]
    assert fidelity["old_total_seconds"] / 86_400 == pytest.approx(20.4, abs=0.1)
    assert fidelity["new_total_seconds"] / 86_400 > 20.4 / 1.25
    assert fidelity["faithful"] is True
