"""The installed ojs-retry console script, run as a real process (issue 6)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(sys.executable).parent / "ojs-retry"

pytestmark = pytest.mark.skipif(not SCRIPT.exists(), reason="ojs-retry is not installed "
                                "(pip install -e . --no-deps)")


def ojs_retry(*args: str, input: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), *args], input=input, capture_output=True, text=True,
                          timeout=60, check=False)


def test_schedule_through_the_entry_point() -> None:
    done = ojs_retry("schedule", "-", "--json", input='{"max_attempts": 4}')
    assert done.returncode == 0, done.stderr
    assert [row["capped"] for row in json.loads(done.stdout)["rows"]] == [1, 2, 4]


def test_bad_input_through_the_entry_point_is_an_ojs_error_not_a_traceback() -> None:
    done = ojs_retry("validate", "-", input='{"backoff_coefficient": 0.5}')
    assert done.returncode == 1
    assert "INVALID_RETRY_POLICY" in done.stderr and "field: backoff_coefficient" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout


def test_migrate_through_the_entry_point(tmp_path: Path) -> None:
    (tmp_path / "jobs.rb").write_text("class A\n  sidekiq_options retry: 0\nend\n")
    done = ojs_retry("migrate", "--from", "sidekiq", str(tmp_path), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["migrations"][0]["policy"]["on_exhaustion"] == "dead_letter"


def test_the_core_never_imports_celery_dramatiq_or_kombu() -> None:
    code = """
import sys
from click.testing import CliRunner
from ojs_adapters.cli import main
import ojs_adapters.migrate as m
r = CliRunner()
assert r.invoke(main, ["--help"]).exit_code == 0
for verb in ("validate", "schedule", "explain", "migrate"):
    assert r.invoke(main, [verb, "--help"]).exit_code == 0
m.from_celery({"max_retries": 2}); m.from_dramatiq({}); m.from_sidekiq({})
r.invoke(main, ["migrate", "--from", "celery", "-"], input="max_retries: 1")
bad = sorted(n for n in sys.modules if n.split(".")[0] in ("celery", "dramatiq", "kombu"))
print(bad)
assert not bad, bad
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
