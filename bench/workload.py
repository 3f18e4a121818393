"""What the end-to-end benchmarks run: the job mixes, the job body and its journal.

Every job is one call of ``Journal.attempt(key, fail_times)``: the body notes when
each attempt started, raises ``PlannedFailure`` for the first ``fail_times``
attempts, and counts the job as ended at its last attempt (a success, or the
third failure). Native and OJS tasks run this same body, so the only difference
between the two sides of a ratio is the retry machinery around it.

>>> journal = Journal()
>>> journal.expect(1)
>>> journal.attempt("a", 0)
1
>>> journal.ended.is_set()
True
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

#: The two sides of every comparison: the framework's own retries, or the OJS adapter; and,
#: for the ``reference`` section only, Dramatiq's own retries with its ``Results`` middleware
#: storing every job's result in Redis (``results``).
Variant = Literal["native", "ojs", "results"]
#: Both variants, in the order of an even round.
VARIANTS: tuple[Variant, Variant] = ("native", "ojs")
#: Attempts every policy allows (native: 2 retries; OJS: ``max_attempts`` 3).
MAX_ATTEMPTS = 3
#: The fixed retry delay of the throughput runs, seconds (short: measure overhead, not sleep).
E2E_DELAY = 0.01
#: Retry delays of the timing-accuracy runs, seconds.
TIMING_DELAYS = (0.1, 1.0, 5.0)
#: Retry delay of the memory runs, seconds: every job is still waiting when RSS is read.
MEMORY_DELAY = 300.0
#: Key of a job that only wakes a worker up (Celery's shutdown); the journal ignores it.
WAKE_KEY = "wake"
#: Every delay a side declares tasks or actors for.
ALL_DELAYS = (E2E_DELAY, *TIMING_DELAYS, MEMORY_DELAY)


class PlannedFailure(Exception):
    """The failure a job raises on purpose."""


@dataclass(frozen=True)
class Mix:
    """A workload: every job fails ``fail_times`` times (3: exhausted, dead-lettered)."""

    name: str
    fail_times: int

    @property
    def attempts(self) -> int:
        """Attempts each job runs."""
        return min(self.fail_times + 1, MAX_ATTEMPTS)

    @property
    def dead_letters(self) -> bool:
        """Whether every job ends in the dead-letter queue."""
        return self.fail_times >= MAX_ATTEMPTS


#: The three mixes of the issue, in report order.
MIXES = (Mix("success", 0), Mix("fail once", 1), Mix("exhausted + DLQ", MAX_ATTEMPTS))


class Journal:
    """Thread-safe notes of attempt starts and failures per job key, and an end signal."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.starts: defaultdict[str, list[float]] = defaultdict(list)
        self.fails: defaultdict[str, list[float]] = defaultdict(list)
        self.ended = threading.Event()
        #: ``time.time()`` when the expected jobs had ended.
        self.ended_at = 0.0
        self._ended = 0
        self._target = 0

    def expect(self, jobs: int) -> None:
        """Forget everything; ``ended`` is set once ``jobs`` jobs have ended."""
        with self._lock:
            self.starts.clear()
            self.fails.clear()
            self._ended, self._target = 0, jobs
            self.ended.clear()

    def attempt(self, key: str, fail_times: int) -> int:
        """The job body: note the start, fail as planned, count the end."""
        if key == WAKE_KEY:
            return 0
        now = time.time()
        with self._lock:
            starts = self.starts[key]
            starts.append(now)
            attempt = len(starts)
        failing = attempt <= fail_times
        with self._lock:
            if failing:
                self.fails[key].append(time.time())
            if not failing or attempt >= MAX_ATTEMPTS:
                self._ended += 1
                if self._ended == self._target:
                    self.ended_at = time.time()
                    self.ended.set()
        if failing:
            raise PlannedFailure(f"planned failure {attempt} of {key}")
        return attempt

    def body(self) -> Callable[[str, int], int]:
        """``attempt`` as a plain function, as task and actor decorators want it."""
        attempt = self.attempt

        def bench_job(key: str, fail_times: int) -> int:
            return attempt(key, fail_times)

        return bench_job

    def wait(self, timeout: float) -> None:
        """Block until the expected jobs ended; ``TimeoutError`` after ``timeout`` s."""
        if not self.ended.wait(timeout):
            raise TimeoutError(f"{self._ended} of {self._target} jobs ended in {timeout:.0f} s")

    def busy_seconds(self) -> float:
        """From the first attempt's start to the end of the last expected job."""
        with self._lock:
            first = min(starts[0] for starts in self.starts.values())
        return self.ended_at - first

    @property
    def failures(self) -> int:
        """Failed attempts so far."""
        with self._lock:
            return sum(len(f) for f in self.fails.values())


class Side(Protocol):
    """One framework on one broker, with native and OJS tasks and a running worker."""

    framework: str
    broker: str
    journal: Journal

    def send(self, variant: Variant, delay: float, key: str, fail_times: int) -> None:
        """Enqueue one job of ``variant`` whose retries wait ``delay`` s."""

    def start(self, variants: tuple[Variant, ...]) -> None:
        """Let these variants' workers consume."""

    def stop(self) -> None:
        """Stop consuming (pause or stop the workers), so jobs can be queued up first."""

    def dead_letters(self, variant: Variant) -> int:
        """Messages in ``variant``'s dead-letter queue."""

    def purge_dead_letters(self, variant: Variant) -> None:
        """Empty ``variant``'s dead-letter queue."""

    def close(self) -> None:
        """Stop the workers; delete every key and queue this side created."""
