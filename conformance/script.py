"""The scripted handler every driver runs, and the log it keeps of its attempts.

The handler counts its own attempts in an append-only file per job (one JSON
line per start), so the count does not depend on the adapter under test and
survives a killed worker process.

>>> import tempfile
>>> log = AttemptLog(tempfile.mkdtemp())
>>> run_script("job-1", [{"kind": "succeed", "arg": None}], str(log.folder))
'ok after 1 attempt(s)'
>>> len(log.starts("job-1"))
1
"""

from __future__ import annotations

import builtins
import importlib
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from ojs_adapters import JobError

#: How long a ``timeout`` step sleeps; drivers set the time limit well below it.
TIMEOUT_SLEEP_SECONDS = 30.0

#: The running job's jitter sample, set by the handler for ``scripted_jitter`` to read.
_CURRENT = threading.local()


def scripted_jitter() -> float:
    """A jitter source for the adapters: the current job's scenario sample (else 0.5).

    The adapter draws jitter in the thread that ran the handler, right after it
    failed, so a thread-local set by ``run_script`` names the job.
    """
    sample = getattr(_CURRENT, "sample", None)
    return 0.5 if sample is None else float(sample)


class AttemptLog:
    """Start times of each job's attempts, one file per job under ``folder``."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def _path(self, job: str) -> Path:
        return self.folder / f"{job}.jsonl"

    def record_start(self, job: str) -> int:
        """Append a start line; return this attempt's number (1-indexed)."""
        line = json.dumps({"t": time.time(), "pid": os.getpid()}) + "\n"
        fd = os.open(self._path(job), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return len(self.starts(job))

    def starts(self, job: str) -> list[float]:
        """Start times (POSIX seconds) of the job's attempts, in order."""
        path = self._path(job)
        if not path.exists():
            return []
        return [json.loads(line)["t"] for line in path.read_text().splitlines() if line]


def _exception_class(path: str) -> type[BaseException]:
    if "." not in path:
        found = getattr(builtins, path)
    else:
        module, _, name = path.rpartition(".")
        found = getattr(importlib.import_module(module), name)
    if not (isinstance(found, type) and issubclass(found, BaseException)):
        raise TypeError(f"{path} is not an exception class")
    return found


def run_script(job: str, script: list[dict[str, Any]], log_folder: str,
               jitter_sample: float | None = None) -> str:
    """Do what ``script`` says for this attempt: the body of every conformance handler."""
    _CURRENT.sample = jitter_sample
    attempt = AttemptLog(log_folder).record_start(job)
    step = script[min(attempt, len(script)) - 1]
    kind: str = step["kind"]
    arg: Any = step.get("arg")
    if kind == "succeed":
        return f"ok after {attempt} attempt(s)"
    if kind == "raise":
        raise _exception_class(arg)(f"scripted failure on attempt {attempt}")
    if kind == "job_error":
        raise JobError(arg["type"], arg.get("message", ""), code=arg.get("code"),
                       details={"attempt": attempt})
    if kind == "timeout":
        # Short slices: Dramatiq's time limit is an async exception, delivered between
        # bytecodes, which one long sleep would hold off until it returned.
        deadline = time.monotonic() + TIMEOUT_SLEEP_SECONDS
        while time.monotonic() < deadline:
            time.sleep(0.05)
        return "slept through the time limit"
    if kind == "crash":
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(10)  # pragma: no cover - the process is gone
    raise ValueError(f"unknown step kind {kind!r}")
