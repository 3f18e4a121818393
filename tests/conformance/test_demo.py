"""``ojs-retry demo`` reads well at 80 columns: only its tables and sentences (issues 7, 16).

The README's first command runs from the installed entry point; the frameworks'
own logs (tracebacks of the jobs that fail on purpose, kombu's warnings) go to a
log file, and a dead-lettered job is shown as dead-lettered, not as discarded.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from conformance.demo import DEMO_JOBS, _Job, _jobs_table, _summary, result


def _ojs_retry() -> list[str]:
    script = Path(sys.executable).with_name("ojs-retry")
    found = str(script) if script.exists() else shutil.which("ojs-retry")
    assert found, "the ojs-retry console script is not installed"
    return [found]


def _row(out: str, job: str, framework: str) -> str:
    """The line of the Jobs table for ``job`` on ``framework``, right-stripped."""
    jobs = out[out.index("Jobs"):out.index("Error history")].splitlines()
    start = next(n for n, line in enumerate(jobs) if line.startswith(job))
    return next(line.rstrip() for line in jobs[start:start + 2] if f" {framework} " in line)


def test_demo_at_80_columns_shows_only_its_tables_and_both_frameworks_agree() -> None:
    env = dict(os.environ, COLUMNS="80", LINES="40", TERM="dumb")
    done = subprocess.run([*_ojs_retry(), "demo"], capture_output=True, text=True,
                          timeout=60, env=env, check=False)
    out = done.stdout + done.stderr
    log_file = Path(out.rstrip().splitlines()[-1])
    try:
        assert done.returncode == 0, out
        assert done.stderr == ""
        too_long = [line for line in out.splitlines() if len(line) > 80]
        assert too_long == [], too_long
        assert "Traceback" not in out
        assert "No hostname was supplied" not in out
        assert "…" not in out  # nothing cut by a column too narrow
        assert "Celery and Dramatiq agree on every job." in out
        seconds = float(re.search(r"Finished in ([\d.]+)s", out).group(1))  # type: ignore[union-attr]
        assert seconds < 30
        for framework in ("celery", "dramatiq"):
            assert _row(out, "non-retryable error", framework).endswith(" dead-lettered")
            assert _row(out, "always fails", framework).endswith(" dead-lettered")
            assert _row(out, "handler says DISCARD", framework).endswith(" discarded")
            assert re.search(r"x \+\S+s  x \+\S+s  ok \+\S+s  completed$",
                             _row(out, "fails twice, then ok", framework))
        queues = out[out.index("Dead-letter queues"):].splitlines()
        for framework in ("celery", "dramatiq"):
            line = next(q for q in queues if q.startswith(framework))
            assert "non-retryable error" in line and "always fails" in line
            assert "DISCARD" not in line
        # captured, not lost: the failing jobs' tracebacks are in the log file
        logged = log_file.read_text()
        assert "Traceback" in logged and "No hostname was supplied" in logged
    finally:
        if log_file.name.startswith("ojs-demo-") and log_file.is_file():
            log_file.unlink()


def test_result_names_a_dead_lettered_job_dead_lettered() -> None:
    assert result({"state": "discarded", "dead_lettered": True}) == "dead-lettered"
    assert result({"state": "discarded", "dead_lettered": False}) == "discarded"
    assert result({"state": "retryable"}) == "retryable"
    assert result(None) == "sent"


#: Per demo job, as the adapters record it: (code, type, handler code, failed attempts,
#: final state, dead-lettered).
_ENDS = {
    "retry-then-success-keeps-history": ("HANDLER_ERROR", "ValueError", None, 2, "completed",
                                         False),
    "non-retryable-exact-match": ("NON_RETRYABLE_ERROR", "payment.card_stolen", None, 1,
                                  "discarded", True),
    "handler-discard": ("HANDLER_ERROR", "payment.card_declined", "DISCARD", 1, "discarded",
                        False),
    "exhaustion-dead-letters": ("HANDLER_ERROR", "ValueError", None, 3, "discarded", True),
}


def test_tables_fit_80_columns_uncut_even_when_slow() -> None:
    """Every demo job, attempts up to 99 s after send, on a console exactly 80 wide."""
    sent = 1767225600.0
    jobs = []
    for scenario_id, (code, kind, handler, failures, state, dead) in _ENDS.items():
        errors = [{"attempt": n, "code": code, "type": kind, "handler_code": handler,
                   "occurred_at": f"2026-01-01T00:01:{30 + n}.000Z"}
                  for n in range(1, failures + 1)]
        record = {"state": state, "dead_lettered": dead, "errors": errors,
                  "countdowns": [10.25, 20.5][:failures - (state != "completed")]}
        jobs += [_Job(framework, scenario_id, "key", f"{framework}-{scenario_id}", sent,
                      record=record, starts=[sent + 90.5 + n for n in range(len(errors))])
                 for framework in ("celery", "dramatiq")]
    in_queue = {j.job_id for j in jobs if j.record and j.record["dead_lettered"]}
    console = Console(width=80, record=True, color_system=None)
    console.print(_jobs_table(jobs))
    console.print(_summary(jobs, {"celery": in_queue, "dramatiq": set()}))
    text = console.export_text()
    assert [line for line in text.splitlines() if len(line.rstrip()) > 80] == []
    assert "…" not in text
    for label in DEMO_JOBS.values():  # no label folded over two lines
        assert label in text
    assert "payment.card_declined  DISCARD  +91.00s  discarded" in text
    assert "NON_RETRYABLE_ERROR  payment.card_stolen  +91.00s  dead-lettered" in text
    assert "x +90.50s  x +91.50s  x +92.50s  dead-lettered" in text
    assert "+92.00s  retry in 20.50s" in text
    assert "celery     non-retryable error, always fails" in text
    assert "dramatiq   (empty)" in text


def _demo_without(*modules: str, broker: str = "memory") -> subprocess.CompletedProcess[str]:
    """``ojs-retry demo`` in a process where ``modules`` cannot be imported (not installed)."""
    hide = "".join(f"sys.modules[{name!r}] = None; " for name in modules)
    code = (f"import sys; {hide}from ojs_adapters.cli import main; "
            f"sys.argv = ['ojs-retry', 'demo', '--broker', {broker!r}]; main()")
    env = dict(os.environ, COLUMNS="80", LINES="40", TERM="dumb")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=env, check=False)


def test_demo_with_one_framework_installed_shows_it_and_names_the_other_extra() -> None:
    done = _demo_without("dramatiq")
    out = done.stdout + done.stderr
    log_file = Path(out.rstrip().splitlines()[-1])
    try:
        assert done.returncode == 0, out
        assert "Traceback" not in out
        assert "4 jobs, on Celery." in out
        assert "Not shown: Dramatiq (pip install 'ojs-adapters[dramatiq]' adds it)." in out
        assert [line for line in out.splitlines() if len(line) > 80] == []
        assert _row(out, "fails twice, then ok", "celery").endswith(" completed")
        assert " dramatiq " not in out[out.index("Jobs"):]
        assert "agree" not in out
    finally:
        if log_file.name.startswith("ojs-demo-") and log_file.is_file():
            log_file.unlink()


def test_demo_without_a_framework_or_a_broker_client_says_which_extra() -> None:
    done = _demo_without("celery", "dramatiq")
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert "pip install 'ojs-adapters[celery,dramatiq]'" in done.stderr
    done = _demo_without("celery", "pika", broker="amqp://guest:guest@127.0.0.1:1//")
    assert done.returncode == 1
    assert "pip install 'ojs-adapters[celery-rabbitmq,dramatiq-rabbitmq]'" in done.stderr
    done = _demo_without(broker="foo://host")
    assert done.returncode == 2
    assert "Invalid value for '--broker': 'foo://host'" in done.stderr
    assert "Traceback" not in done.stderr
