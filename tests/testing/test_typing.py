"""``RetryPolicyDict``: ``mypy --strict`` flags a misspelt policy key where a user writes one.

Run time already refuses it (RET-16, ``additionalProperties: false``); the type moves
that to the editor and the type check. One mypy run checks a snippet with the typo at
every typed ``retry_policy`` place, and one with correct keys that must pass.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mypy")

ROOT = Path(__file__).resolve().parents[2]

#: The typo in every place a policy mapping is typed; each marked line must fail.
MISSPELT = '''\
from celery_ext import OjsTask
from dramatiq_ext import OjsRetries
from ojs_adapters import RetryPolicyDict


class Charge(OjsTask):
    retry_policy = {"max_attemps": 3}  # FLAGGED


OjsRetries(default_policy={"max_attemps": 3})  # FLAGGED
Charge().apply_async((7,), retry_policy={"max_attemps": 3})  # FLAGGED
policy: RetryPolicyDict = {"max_attemps": 3}  # FLAGGED
'''

#: The same places spelt right (and Celery's own publish retry dict): no error.
CORRECT = '''\
from celery_ext import OjsTask
from dramatiq_ext import OjsRetries
from ojs_adapters import RetryPolicy, RetryPolicyDict


class Charge(OjsTask):
    retry_policy = {"max_attempts": 3, "on_exhaustion": "dead_letter",
                    "non_retryable_errors": ["payment.*"], "initial_interval": "PT1S"}


OjsRetries(default_policy={"max_attempts": 3, "jitter": False, "backoff_coefficient": 1.5})
OjsRetries(default_policy=RetryPolicy())
Charge().apply_async((7,), retry_policy={"max_attempts": 2, "max_duration": None})
Charge().apply_async((7,), retry_policy={"max_retries": 2, "interval_start": 0})
policy: RetryPolicyDict = {"max_attempts": 3, "backoff_strategy": "linear"}
RetryPolicy.from_dict(policy)
'''


def test_misspelt_policy_key_fails_mypy_strict(tmp_path: Path) -> None:
    (tmp_path / "misspelt.py").write_text(MISSPELT)
    (tmp_path / "correct.py").write_text(CORRECT)
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--config-file", str(ROOT / "pyproject.toml"),
         "--cache-dir", str(tmp_path / "cache"), "--follow-imports=silent", "--no-pretty",
         "misspelt.py", "correct.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=170, check=False)
    output = run.stdout + run.stderr
    assert run.returncode == 1, output
    flagged = {int(n) for n in re.findall(r"^misspelt\.py:(\d+): error:", output, re.M)}
    expected = {n for n, line in enumerate(MISSPELT.splitlines(), 1) if "# FLAGGED" in line}
    assert flagged == expected, output
    assert "correct.py" not in output, output
