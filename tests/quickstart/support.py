"""Run the README's snippets as a user would: files in a folder, real worker commands.

``readme_block(name)`` is the code between ``<!-- name -->`` and ``<!-- /name -->`` in
README.md. ``Worker`` starts a framework's own command line (``celery -A app worker``,
``dramatiq app``) in that folder, with the packages of the extras a setup does not
install made unimportable (``blocker/sitecustomize.py``), and collects its output.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BLOCKER = Path(__file__).resolve().parent / "blocker"
BIN = Path(sys.executable).parent

#: Packages a setup's extras do not install, per extra of pyproject.toml.
MISSING = {
    "celery-redis": ("pika", "dramatiq", "prometheus_client", "pytest"),
    "celery-rabbitmq": ("redis", "pika", "dramatiq", "prometheus_client", "pytest"),
    "dramatiq-redis": ("pika", "celery", "kombu", "prometheus_client", "pytest"),
    "dramatiq-rabbitmq": ("redis", "celery", "kombu", "prometheus_client", "pytest"),
}


def readme_block(name: str, document: str = "README.md") -> str:
    """The fenced code between the ``<!-- name -->`` markers of ``document`` (README.md)."""
    text = (ROOT / document).read_text()
    match = re.search(rf"<!-- {re.escape(name)} -->\n```[a-z]*\n(.*?)```\n<!-- /{name} -->",
                      text, re.S)
    assert match, f"{document} has no block <!-- {name} -->"
    return match.group(1)


def environment(extra: str) -> dict[str, str]:
    """A subprocess environment in which only ``extra``'s packages import."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(BLOCKER)
    env["OJS_BLOCK"] = ",".join(MISSING[extra])
    env.pop("CELERY_BROKER_URL", None)
    return env


def run_script(folder: Path, code: str, extra: str, timeout: float = 60) -> str:
    """Run ``code`` as a script in ``folder``; its stdout (fails the test on a non-zero exit)."""
    script = folder / "snippet.py"
    script.write_text(code)
    done = subprocess.run([sys.executable, str(script)], cwd=folder, env=environment(extra),
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"snippet failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


class Worker:
    """A worker started by its framework's own command, its output kept as it comes."""

    def __init__(self, argv: list[str], folder: Path, extra: str, ready: str) -> None:
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            [str(BIN / argv[0]), *argv[1:]], cwd=folder, env=environment(extra),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()
        self.wait_for(ready, timeout=60)

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        """Everything the worker printed so far."""
        return "\n".join(self.lines)

    def wait_for(self, text: str, timeout: float) -> None:
        """Wait until ``text`` appears in the output; fail with the output if it does not."""
        deadline = time.monotonic() + timeout
        while text not in self.output:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"worker never printed {text!r}:\n{self.output}")
            time.sleep(0.1)

    def stop(self) -> None:
        """SIGTERM the worker's process group (a warm shutdown); SIGKILL if it lingers."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
