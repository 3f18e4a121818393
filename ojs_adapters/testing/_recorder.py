"""``RetryRecorder``: what happened to the jobs run inside ``instant_retries()``.

The recorder sees every decision through the core's hooks (``ojs_adapters.runtime.events``)
and reads a job's record with the adapter's own reader (``celery_ext.get_job_record``,
``dramatiq_ext.get_job_record``), so a test sees what a worker would have decided and
stored. While it is active, ``ojs_adapters.runtime._instant`` makes the adapters skip the waits.
Celery and Dramatiq are imported only when a record of theirs is asked for.
"""

from __future__ import annotations

import sys
import threading
from types import TracebackType
from typing import Any

from ojs_adapters.decision import Decision
from ojs_adapters.history import JobRecord, Outcome
from ojs_adapters.policy import check_jitter_sample
from ojs_adapters.runtime._instant import RECORDERS_REGISTRY, answers_key, shared_state
from ojs_adapters.runtime.events import DecisionEvent, add_hook, remove_hook


class RetryRecorder:
    """Instant retries while active (a ``with`` block), and every decision, by job id.

    Get one from ``instant_retries()`` or the pytest fixture ``ojs_retries``. Queries
    take a Celery task id or a Dramatiq message id:

    - ``attempts(job_id)``: attempts that ran (the record's ``attempt``);
    - ``countdowns(job_id)``: the delay in seconds decided for each retry, in order:
      exactly what a worker would have waited;
    - ``outcome(job_id)``: ``"completed"``, ``"discarded"``, ``"dead_letter"``,
      ``"failed"``, or ``None`` while the job is not over;
    - ``record(job_id)``: the ``JobRecord`` the adapter stored;
    - ``decisions(job_id)``, ``events``, ``jobs()``: the raw material.

    ``jitter_sample`` (u in [0, 1), or ``None``) pins the jitter of every decision made
    while the recorder is active: 0.5 gives the multiplier 1.0, the jitter-free delays.

    >>> from ojs_adapters.testing import instant_retries
    >>> with instant_retries(jitter_sample=0.5) as retries:
    ...     pass                                   # send and run jobs here
    >>> retries.jobs(), retries.countdowns("no-such-job"), retries.outcome("no-such-job")
    ([], [], None)
    """

    def __init__(self, *, jitter_sample: float | None = None) -> None:
        self.jitter_sample = jitter_sample
        self._lock = threading.Lock()
        self._events: list[DecisionEvent] = []
        self._jobs: dict[str, None] = {}  # ids in the order first seen
        self._sources: dict[str, tuple[str, object]] = {}  # id -> (framework, app or broker)
        self._built: dict[str, JobRecord] = {}  # records eager Celery runs built
        self._active = False
        self._state: dict[object, Any] = {}  # what lasts the block (``_instant.block_state``)

    # -- the switch -----------------------------------------------------------------------

    @property
    def jitter_sample(self) -> float | None:
        """The pinned jitter sample u in [0, 1), or ``None``: drawn as configured."""
        return self._jitter_sample

    @jitter_sample.setter
    def jitter_sample(self, value: float | None) -> None:
        if value is not None:
            check_jitter_sample(value)
        self._jitter_sample = value

    def __enter__(self) -> RetryRecorder:
        if self._active:
            raise RuntimeError("this RetryRecorder is already active")
        self._active = True
        self._state = shared_state()  # a block inside another is the same test
        add_hook(self._on_event)
        RECORDERS_REGISTRY.append(self)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self in RECORDERS_REGISTRY:
            RECORDERS_REGISTRY.remove(self)
        remove_hook(self._on_event)
        self._active = False

    # -- what the adapters tell it (``runtime._instant``, ``events``) ----------------------------

    @property
    def state(self) -> dict[object, Any]:
        """State that lasts this block: the retry budgets counted in it, the result backends
        found not to answer (``_instant.block_state``)."""
        return self._state

    def _on_event(self, event: DecisionEvent) -> None:
        with self._lock:
            self._events.append(event)
            self._jobs.setdefault(event.job_id)

    def note_job(self, framework: str, job_id: str, source: object) -> None:
        """Job ``job_id`` of ``framework`` keeps its record in ``source`` (app or broker)."""
        with self._lock:
            self._jobs.setdefault(job_id)
            if source is not None:
                self._sources[job_id] = (framework, source)

    def note_record(self, framework: str, record: JobRecord) -> None:
        """An eager run built ``record`` (kept for a backend that stores none)."""
        with self._lock:
            self._jobs.setdefault(record.id)
            self._built[record.id] = record

    # -- queries ----------------------------------------------------------------------------

    @property
    def events(self) -> list[DecisionEvent]:
        """Every decision seen, in order."""
        with self._lock:
            return list(self._events)

    def jobs(self) -> list[str]:
        """The ids of the jobs seen (run eagerly, or decided on), in order."""
        with self._lock:
            return list(self._jobs)

    def decisions(self, job_id: str) -> list[Decision]:
        """The decisions taken on job ``job_id``, one per failed attempt."""
        return [e.decision for e in self.events if e.job_id == job_id]

    def countdowns(self, job_id: str) -> list[float]:
        """Seconds decided before each retry of ``job_id``: what a worker waits (RET-11)."""
        return [float(d.delay or 0.0) for d in self.decisions(job_id) if d.action == "retry"]

    def attempts(self, job_id: str) -> int:
        """Attempts of ``job_id`` that ran: the record's, else counted from the decisions."""
        record = self.record(job_id)
        if record is not None:
            return record.attempt
        decisions = self.decisions(job_id)
        if not decisions:
            return 0
        last = decisions[-1]
        return last.attempt + 1 if last.action == "retry" else last.attempt

    def outcome(self, job_id: str) -> Outcome | None:
        """How ``job_id`` ended (``None`` while it is not over, or unknown)."""
        record = self.record(job_id)
        if record is not None and record.outcome is not None:
            return record.outcome
        decisions = self.decisions(job_id)
        return decisions[-1].outcome if decisions else None

    def record(self, job_id: str) -> JobRecord | None:
        """The job record the adapter stored for ``job_id``, read by the adapter's reader.

        Celery: from the result backend of the app that ran it (an eager run whose app
        stores no results, or whose backend does not answer, gives the record it built).
        Dramatiq: from the broker it ran on, else from the other brokers seen, else from
        the global broker (``dramatiq.set_broker``).
        """
        with self._lock:
            known = self._sources.get(job_id)
            seen = {id(source): (framework, source)
                    for framework, source in self._sources.values()}
            built = self._built.get(job_id)
        candidates = [known] if known else []
        candidates += [o for o in seen.values() if known is None or o[1] is not known[1]]
        dramatiq = sys.modules.get("dramatiq.broker")
        global_broker = getattr(dramatiq, "global_broker", None)
        if global_broker is not None and all(s is not global_broker for _, s in candidates):
            candidates.append(("dramatiq", global_broker))
        for framework, source in candidates:
            if self._state.get(answers_key(source)) is False:
                continue  # the block found it does not answer: the record built stands
            try:
                found = _read(framework, source, job_id)
            except Exception:  # a store out of reach: what the run built still answers
                if built is None:
                    raise
                continue
            if found is not None:
                return built if built is not None and _behind(found, built) else found
        return built


def _behind(stored: JobRecord, built: JobRecord) -> bool:
    """Whether the stored record is older than the one the run built (a write that failed
    after an earlier one went through)."""
    return (stored.attempt, stored.outcome is not None) < (built.attempt,
                                                           built.outcome is not None)


def _read(framework: str, source: Any, job_id: str) -> JobRecord | None:
    """The record of ``job_id`` through ``framework``'s reader on ``source``."""
    if framework == "celery":
        from celery_ext import get_job_record as celery_record

        return celery_record(job_id, app=source)
    from dramatiq_ext import get_job_record as dramatiq_record

    try:
        return dramatiq_record(job_id, broker=source)
    except RuntimeError:  # a broker without OjsRetries
        return None
