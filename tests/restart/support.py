"""What the restart scenarios share: the jobs, their policy, the run log and the verdict.

Every cell (framework x broker) sends ``JOBS`` jobs whose attempt 1 fails and whose
attempt 2 succeeds, with a fixed ``DELAY`` before attempt 2 (jitter off). Once every
job waits for its retry, the broker restarts; then every job must run attempt 2
exactly once (issue 8: a retry survives a broker restart) and never before its delay
(RET-11, ojs-retry.md section 9.1).

Each run of a job body appends one line ``<key> <attempt> <epoch seconds>`` to a
``RunLog`` file (a worker subprocess can write it too; appends of one short line
are atomic).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from tests.brokers import brokers_required

#: Jobs per cell.
JOBS = 20
#: Seconds between attempt 1 failing and attempt 2 (``initial_interval``).
DELAY = 4.0
#: The jobs' policy: a fixed delay, and room for a third attempt so that a lost
#: attempt 2 shows up as a wrong run count rather than as a discarded job.
POLICY: dict[str, Any] = {"max_attempts": 3, "initial_interval": f"PT{DELAY:g}S",
                          "backoff_coefficient": 1.0, "jitter": False}


class Run(NamedTuple):
    key: str
    attempt: int
    started: float


class RunLog:
    """Runs of job bodies, one line each, in a file any process can append to."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.touch()

    def append(self, key: str, attempt: int) -> None:
        line = f"{key} {attempt} {time.time():.6f}\n".encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    def runs(self) -> list[Run]:
        out = []
        for line in self.path.read_text().splitlines():
            key, attempt, started = line.split()
            out.append(Run(key, int(attempt), float(started)))
        return out


def body(log: RunLog, key: str, attempt: int) -> str:
    """The job: note the run; attempt 1 fails, any later one succeeds."""
    log.append(key, attempt)
    if attempt == 1:
        raise ValueError(f"{key}: attempt 1 fails")
    return "ok"


def require_binary(name: str, found: object) -> None:
    """Skip (fail on CI) when a broker binary needed for a private server is missing."""
    if found:
        return
    reason = f"{name} is not installed: the restart tests start a private server"
    if brokers_required():
        pytest.fail(f"{reason}, and CI=true / OJS_REQUIRE_BROKERS=1 forbid skipping")
    pytest.skip(reason)


def wait_for(probe: Callable[[], Any], *, timeout: float, what: str,
             interval: float = 0.1) -> Any:
    """Poll ``probe`` until truthy; an exception (the broker is down) counts as not yet."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = probe()
        except Exception as error:  # a broker or store that is restarting
            last = error
        else:
            if last:
                return last
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached within {timeout:.0f}s (last: {last!r})")
        time.sleep(interval)


def assert_in_backoff(records: list[Any]) -> None:
    """The restart begins while every job waits for its retry (none is due yet)."""
    due = min(datetime.fromisoformat(r.next_retry_at.replace("Z", "+00:00")).timestamp()
              for r in records)
    assert time.time() < due, "the restart must begin while every job is in backoff"


def verdict(keys: list[str], runs: list[Run]) -> None:
    """Every job ran attempt 1 then attempt 2, each exactly once, attempt 2 not early."""
    counts = Counter((run.key, run.attempt) for run in runs)
    expected = {(key, attempt): 1 for key in keys for attempt in (1, 2)}
    lost = sorted(k for k in expected if counts[k] == 0)
    doubled = sorted(k for k, n in counts.items() if n > 1)
    extra = sorted(k for k in counts if k not in expected)
    assert not lost, f"{len(lost)} attempts never ran: {lost[:5]}"
    assert not doubled, f"{len(doubled)} attempts ran twice: {doubled[:5]}"
    assert not extra, f"unexpected attempts ran: {extra[:5]}"
    started = {(run.key, run.attempt): run.started for run in runs}
    early = [key for key in keys
             if started[key, 2] - started[key, 1] < DELAY - 0.01]  # clock resolution
    assert not early, f"attempt 2 ran before its {DELAY}s delay (RET-11): {early[:5]}"
