"""The import contracts of ``.importlinter`` (issue 18) hold, and would catch an arrow up.

CI runs ``lint-imports`` on the tree; this shows the contracts are live: on a copy of the
tree with one upward import added, each names the offending line.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("ojs_adapters", "celery_ext", "dramatiq_ext", "conformance")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run([str(LINT_IMPORTS)], cwd=tree, env=env, capture_output=True,
                          text=True, timeout=120, check=False)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    return tmp_path


@pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is not installed ([dev])")
@pytest.mark.parametrize(("module", "line", "contract"), [
    ("ojs_adapters/backoff.py", "from ojs_adapters.runtime import leases",
     "The spec core imports no runtime"),
    ("ojs_adapters/decision.py", "import redis", "The spec core imports no runtime"),
    ("ojs_adapters/runtime/stats.py", "import celery_ext", "core <- runtime <- adapters"),
    ("celery_ext/_inputs.py", "import dramatiq_ext", "core <- runtime <- adapters"),
    ("celery_ext/records.py", "from celery_ext import _attempt", "No import cycle"),
])
def test_an_arrow_pointing_up_breaks_a_contract(tree: Path, module: str, line: str,
                                                contract: str) -> None:
    assert _lint(tree).returncode == 0, "the copied tree keeps every contract"
    path = tree / module
    path.write_text(path.read_text() + f"\n{line}  # the arrow under test\n")
    result = _lint(tree)
    assert result.returncode != 0
    broken = [row for row in result.stdout.splitlines() if row.endswith("BROKEN")]
    assert any(row.startswith(contract) for row in broken), result.stdout[-2000:]
