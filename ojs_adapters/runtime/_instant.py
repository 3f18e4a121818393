"""Instant retries for tests: the registry of active recorders and the calls adapters make.

``ojs_adapters.testing.instant_retries()`` puts a recorder here for the length of a
``with`` block. The adapters ask this module, at the one place each turns a decision
into a wait, what to hand the framework, and tell it where a job's record is:

- ``broker_delay(ms)``: Dramatiq's hand-off (``dramatiq_ext.middleware``) passes the
  delay of a retry through it: ``0`` while a recorder is active, else unchanged. The
  decision, the record and the recorded countdown keep the real value.
- ``jitter_sample(source)``: the jitter sample u, pinned by the recorder if it asks,
  else drawn from ``source`` as always.
- ``note_job(framework, job_id, source)``: where a job's record lives (the Celery app
  of an eager run, the Dramatiq broker of a delivery), for ``RetryRecorder.record``;
  ``note_record(...)``: the record a Celery eager run built.
- ``block_state(key, make)``: state that lasts one block (the retry budgets counted in
  it, whether a result backend answers), so no test sees another's.

No recorder active (production): each call costs one truth test of a list. This
module imports no framework.

>>> broker_delay(1500)
1500
>>> jitter_sample(lambda: 0.25)
0.25
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from ojs_adapters.history import JobRecord


class Recorder(Protocol):
    """What an instant-retries recorder offers this registry (``ojs_adapters.testing``)."""

    @property
    def jitter_sample(self) -> float | None:
        """The pinned jitter sample u in [0, 1), or ``None`` to draw as usual."""
        ...

    def note_job(self, framework: str, job_id: str, source: object) -> None:
        """Job ``job_id`` of ``framework`` keeps its record in ``source`` (app or broker)."""
        ...

    def note_record(self, framework: str, record: JobRecord) -> None:
        """An eager run built (and tried to store) ``record``."""
        ...

    @property
    def state(self) -> dict[object, Any]:
        """State kept for the length of the block (``block_state``)."""
        ...


#: Registry of the active recorders, innermost last; empty outside ``instant_retries()``.
RECORDERS_REGISTRY: list[Recorder] = []
T = TypeVar("T")


def active() -> bool:
    """Whether retries are instant now (a recorder is active)."""
    return bool(RECORDERS_REGISTRY)


def broker_delay(delay: int | None) -> int | None:
    """The delay (ms) to hand the broker for a successor decided to wait ``delay`` ms:
    ``0`` while retries are instant (``None``, no delay, stays ``None``)."""
    if not RECORDERS_REGISTRY or delay is None:
        return delay
    return 0


def jitter_sample(source: Callable[[], float]) -> float:
    """The jitter sample for a decision: the pin of the innermost recorder that has one,
    else ``source()``."""
    for recorder in reversed(RECORDERS_REGISTRY):
        pinned = recorder.jitter_sample
        if pinned is not None:
            return pinned
    return source()


def note_job(framework: str, job_id: str, source: object) -> None:
    """Tell the active recorders where job ``job_id``'s record is kept."""
    if not RECORDERS_REGISTRY:
        return
    for recorder in tuple(RECORDERS_REGISTRY):
        recorder.note_job(framework, job_id, source)


def note_record(framework: str, record: JobRecord) -> None:
    """Hand the active recorders a record an eager run built."""
    for recorder in tuple(RECORDERS_REGISTRY):
        recorder.note_record(framework, record)


def block_state(key: object, make: Callable[[], T]) -> T:
    """The value of ``key`` for the active block, made by ``make`` the first time it is
    asked for. Blocks inside another share the outer one's (one test); ``key`` holds the
    objects it is about, never their ``id()``. Outside a block: ``make()``, not kept."""
    with _STATE_LOCK:
        recorders = RECORDERS_REGISTRY[:1]
        if not recorders:
            return make()
        state = recorders[0].state
        if key in state:
            return state[key]  # type: ignore[no-any-return]
    made = make()  # outside the lock: a backend's ping may take its timeout
    with _STATE_LOCK:
        return state.setdefault(key, made)  # type: ignore[no-any-return]


def answers_key(store: object) -> tuple[str, object]:
    """The block-state key saying whether ``store`` (a Celery app's result backend)
    answers: written by the eager run, read by ``RetryRecorder.record``."""
    return ("store-answers", store)


def set_block_state(key: object, value: object) -> None:
    """Set ``key`` for the active block (nothing outside one)."""
    with _STATE_LOCK:
        for recorder in RECORDERS_REGISTRY[:1]:
            recorder.state[key] = value


def shared_state() -> dict[object, Any]:
    """The state a block entering now shares: the outer block's, else a new one."""
    with _STATE_LOCK:
        return RECORDERS_REGISTRY[0].state if RECORDERS_REGISTRY else {}


_STATE_LOCK = threading.RLock()
