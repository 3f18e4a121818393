"""The README's first command, ``ojs-retry demo``, runs from the installed entry point (issue 7)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path


def _ojs_retry() -> list[str]:
    script = Path(sys.executable).with_name("ojs-retry")
    found = str(script) if script.exists() else shutil.which("ojs-retry")
    assert found, "the ojs-retry console script is not installed"
    return [found]


def test_demo_shows_every_behaviour_and_both_frameworks_agree() -> None:
    env = dict(os.environ, COLUMNS="200", TERM="dumb")
    done = subprocess.run([*_ojs_retry(), "demo"], capture_output=True, text=True,
                          timeout=60, env=env, check=False)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "both frameworks agree on every outcome: yes" in out
    for framework in ("celery", "dramatiq"):
        assert f"{framework}: fails twice, then succeeds (completed, 3 attempt(s))" in out
        assert f"{framework}: always fails: backoff, then dead letter (dead_letter, 3 " in out
        assert f"{framework}: non-retryable error -> dead letter (dead_letter, 1 " in out
        assert f"{framework}: handler says DISCARD (discarded, 1 attempt(s))" in out
    dead = out[out.index("dead-letter queues"):]
    assert len(re.findall(r"always fails: backoff, then dead letter", dead)) == 2
    assert len(re.findall(r"non-retryable error -> dead letter", dead)) == 2
    assert "handler says DISCARD" not in dead
    seconds = float(re.search(r"finished in ([\d.]+)s", out).group(1))  # type: ignore[union-attr]
    assert seconds < 30
