"""Load test (issue 8): N jobs through a real worker on Redis, every ending checked.

Of the jobs, 5% always fail and 30% fail once (``kind_of``), under ``load_worker.POLICY``
(``max_attempts: 3``, 10 ms intervals, ``on_exhaustion: dead_letter``). The worker
runs in a process of its own (``load_worker``; Celery: ``threads`` pool; Dramatiq:
``dramatiq.Worker``), so its peak RSS (``VmHWM``) is its own. ``run`` then checks, for each job:

- the job record (``get_job_record``) ends as ``EXPECTED`` for its kind (outcome,
  attempt, number of history entries);
- the dead-letter queue, read from the broker, holds each always-failing job once and
  nothing else;
- the bodies ran exactly as often as the policy allows (a Redis counter per run).

Everything lives under a fresh key prefix / namespace and queue, removed afterwards.

    python -m bench.load --jobs 10000                  # both frameworks, a table
    python -m bench.load --jobs 2000 --framework celery

``tests/load`` runs the CI size (``OJS_LOAD_JOBS``, default 2,000).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from bench.load_worker import JOB_NAME, celery_app, dramatiq_broker, serve

#: (outcome, attempt, history entries) each kind of job must end with.
EXPECTED = {"ok": ("completed", 1, 0), "flaky": ("completed", 2, 1),
            "dead": ("dead_letter", 3, 3)}
#: Runs of the body per kind under ``load_worker.POLICY``.
RUNS = {"ok": 1, "flaky": 2, "dead": 3}
#: The Redis the load runs on.
REDIS_URL = os.environ.get("OJS_REDIS_URL", "redis://127.0.0.1:6379/0")
#: Worker threads.
THREADS = 8
_ROOT = Path(__file__).resolve().parents[1]


def kind_of(index: int) -> str:
    """Job ``index``'s kind: 1 in 20 ``dead`` (5%), 6 in 20 ``flaky`` (30%), else ``ok``."""
    slot = index % 20
    return "dead" if slot == 0 else "flaky" if slot <= 6 else "ok"


@dataclass
class LoadResult:
    """What one run saw; ``problems`` is empty when every check passed."""

    framework: str
    jobs: int
    seconds: float
    outcomes: Counter[str]
    dead_letters: int
    runs: int
    peak_rss_mb: float
    problems: list[str] = field(default_factory=list)

    def row(self) -> str:
        ends = ", ".join(f"{k} {v}" for k, v in sorted(self.outcomes.items()))
        return (f"{self.framework:9} {self.jobs:7} {self.seconds:8.1f} s  {ends:36} "
                f"DLQ {self.dead_letters:5}  runs {self.runs:6}  peak RSS "
                f"{self.peak_rss_mb:6.1f} MB  {'OK' if not self.problems else 'FAILED'}")


# -- one run -------------------------------------------------------------------------------


class _Worker:
    """The worker subprocess, its log, and its memory."""

    def __init__(self, framework: str, prefix: str, queue: str, redis_url: str,
                 threads: int) -> None:
        # Outlives this call (the worker writes it until ``stop``): no context manager.
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115
            prefix="ojs-load-", suffix=".log", delete=False)
        env = {**os.environ, "PYTHONPATH": str(_ROOT)}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.load", "--serve", framework, "--prefix", prefix,
             "--queue", queue, "--redis", redis_url, "--threads", str(threads)],
            cwd=_ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def peak_rss_mb(self) -> float:
        """``VmHWM``: the peak resident set of the worker process so far."""
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        kib = next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM"))
        return int(kib) / 1024

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()

    def tail(self, lines: int = 30) -> str:
        return "\n".join(Path(self.log.name).read_text(errors="replace").splitlines()[-lines:])


def _wait_for_ends(ids: Iterable[str], read: Callable[[str], Any],
                   timeout: float) -> dict[str, Any]:
    """Poll the records of ``ids`` until each has an outcome (or ``timeout`` passes)."""
    pending, ended = set(ids), {}
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        for job_id in list(pending):
            record = read(job_id)
            if record is not None and record.outcome is not None:
                ended[job_id] = record
                pending.discard(job_id)
        if pending:
            time.sleep(0.5)
    return ended


def run(framework: str, jobs: int, *, redis_url: str = REDIS_URL, threads: int = THREADS,
        timeout: float = 600.0) -> LoadResult:
    """Send ``jobs`` jobs through a fresh ``framework`` worker and check how each ended."""
    prefix = f"ojs-load-{uuid.uuid4().hex[:10]}"
    queue = f"{prefix}-q"
    client = redis.Redis.from_url(redis_url)
    worker = _Worker(framework, prefix, queue, redis_url, threads)
    try:
        started = time.monotonic()
        if framework == "celery":
            from celery_ext import get_job_record as celery_record

            app = celery_app(prefix, redis_url)
            task = app.tasks[JOB_NAME]
            with app.producer_or_acquire() as producer:
                kinds = {task.apply_async((kind_of(i),), queue=queue, producer=producer).id:
                         kind_of(i) for i in range(jobs)}
            ended = _wait_for_ends(kinds, lambda i: celery_record(i, app=app), timeout)
            letters = _celery_dead_letters(app, f"{queue}.dead_letter",
                                           expect=Counter(kinds.values())["dead"])
        else:
            from dramatiq_ext import get_job_record as dramatiq_record

            broker, actor = dramatiq_broker(prefix, queue, redis_url)
            kinds = {actor.send(kind_of(i)).message_id: kind_of(i) for i in range(jobs)}
            ended = _wait_for_ends(kinds, lambda i: dramatiq_record(i, broker=broker), timeout)
            letters = _dramatiq_dead_letters(client, f"{prefix}:{queue}.XQ",
                                             expect=Counter(kinds.values())["dead"])
        seconds = time.monotonic() - started
        peak = worker.peak_rss_mb()
        runs = int(client.get(f"{prefix}:runs") or 0)
        result = LoadResult(framework, jobs, seconds, Counter(r.outcome for r in ended.values()),
                            len(letters), runs, peak)
        result.problems = _problems(kinds, ended, letters, runs)
        if result.problems:
            result.problems.append("worker log tail:\n" + worker.tail())
        return result
    finally:
        worker.stop()
        Path(worker.log.name).unlink(missing_ok=True)
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        for start in range(0, len(keys), 1000):
            client.delete(*keys[start:start + 1000])


def _problems(kinds: dict[str, str], ended: dict[str, Any], letters: list[str],
              runs: int) -> list[str]:
    out = [f"{len(kinds) - len(ended)} jobs never ended"] if len(ended) < len(kinds) else []
    wrong = [(i, kinds[i], (r.outcome, r.attempt, len(r.errors))) for i, r in ended.items()
             if (r.outcome, r.attempt, len(r.errors)) != EXPECTED[kinds[i]]]
    if wrong:
        out.append(f"{len(wrong)} jobs ended wrong, e.g. {wrong[:3]}")
    dead = sorted(i for i, k in kinds.items() if k == "dead")
    if sorted(letters) != dead:
        extra, missing = set(letters) - set(dead), set(dead) - set(letters)
        out.append(f"dead-letter queue: {len(letters)} messages for {len(dead)} dead jobs "
                   f"({len(extra)} unexpected ids, {len(missing)} missing, "
                   f"{len(letters) - len(set(letters))} duplicates)")
    expected_runs = sum(RUNS[k] for k in kinds.values())
    if runs != expected_runs:
        out.append(f"bodies ran {runs} times, the policy allows exactly {expected_runs}")
    return out


def _celery_dead_letters(app: Any, queue: str, *, expect: int) -> list[str]:
    """Task ids of every message in Celery dead-letter queue ``queue`` (consumed)."""
    ids: list[str] = []
    with app.connection_for_write() as conn:
        simple = conn.SimpleQueue(queue, no_ack=False)
        try:
            idle_until = time.monotonic() + 15
            while time.monotonic() < idle_until:
                try:
                    message = simple.get(timeout=0.5 if len(ids) < expect else 0.2)
                except simple.Empty:
                    if len(ids) >= expect:
                        break  # all there; one more empty read shows nothing extra follows
                    continue
                message.ack()
                ids.append(str(message.headers["id"]))
                idle_until = time.monotonic() + 15
        finally:
            simple.close()
    return ids


def _dramatiq_dead_letters(client: Any, key: str, *, expect: int) -> list[str]:
    """Message ids in Dramatiq's dead-letter set ``key`` (waits for ``expect`` of them).

    Read as Dramatiq's Redis broker stores them: a sorted set of its own ids, the
    message bodies in the hash ``<key>.msgs``.
    """
    deadline = time.monotonic() + 15
    while client.zcard(key) < expect and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(0.5)  # anything extra would land now
    from dramatiq.message import Message

    # Members are the broker's own ``redis_message_id``s; the bodies sit in ``<key>.msgs``.
    members = client.zrange(key, 0, -1)
    bodies = client.hmget(key + ".msgs", members) if members else []
    return [Message.decode(body).message_id for body in bodies if body is not None]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__.split(
        "\n")[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--framework", choices=["celery", "dramatiq", "both"], default="both")
    parser.add_argument("--redis", default=REDIS_URL)
    parser.add_argument("--threads", type=int, default=THREADS)
    parser.add_argument("--serve", choices=["celery", "dramatiq"], help=argparse.SUPPRESS)
    parser.add_argument("--prefix", help=argparse.SUPPRESS)
    parser.add_argument("--queue", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve, args.prefix, args.queue, args.redis, args.threads)
        return 0
    frameworks = ["celery", "dramatiq"] if args.framework == "both" else [args.framework]
    failed = False
    for framework in frameworks:
        result = run(framework, args.jobs, redis_url=args.redis, threads=args.threads)
        print(result.row(), flush=True)
        for problem in result.problems:
            print("  " + problem)
        failed |= bool(result.problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
