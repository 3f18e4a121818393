"""The interface every framework driver implements, and what it observes of a job.

A driver owns a worker on one broker. The runner submits every scenario's job
through it, waits, and reads back the job record and the dead-letter queue;
the scenario's script runs in ``conformance.script.run_script``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar

from conformance.scenarios import Scenario


@dataclass(frozen=True)
class Observation:
    """What a run of one scenario left behind."""

    scenario_id: str
    job_id: str | None
    starts: tuple[float, ...] = ()
    record: dict[str, Any] | None = None
    in_dead_letter_queue: bool = False
    rejected: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)


class Driver(ABC):
    """Runs scenario jobs on one framework and broker.

    Subclasses start a worker in ``start`` and stop it in ``stop``; the handler
    they register must call ``conformance.script.run_script(job_key, script,
    log_folder)`` and the adapter's jitter source must return the scenario's
    ``jitter_sample`` for that job.
    """

    #: The framework's name as users type it: ``celery`` or ``dramatiq``.
    framework: ClassVar[str]

    def __init__(self, broker_url: str, log_folder: Path) -> None:
        self.broker_url = broker_url
        self.log_folder = log_folder

    #: What the driver's worker can do beyond the basics (see ``scenarios.CAPABILITIES``).
    @property
    @abstractmethod
    def capabilities(self) -> frozenset[str]: ...

    @abstractmethod
    def start(self, scenarios: tuple[Scenario, ...]) -> None:
        """Start the worker(s) able to run ``scenarios``."""

    @abstractmethod
    def stop(self) -> None:
        """Stop the worker(s) and release the broker."""

    @abstractmethod
    def submit(self, scenario: Scenario, job_key: str) -> str:
        """Enqueue the scenario's job; return its id. A refused policy raises ``OjsError``."""

    @abstractmethod
    def job_record(self, job_id: str) -> dict[str, Any] | None:
        """The adapter's job record for ``job_id`` (DESIGN.md), or ``None``."""

    @abstractmethod
    def dead_lettered_ids(self) -> set[str]:
        """Ids of the jobs now in the dead-letter queue(s) of this run."""

    def __enter__(self) -> Driver:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
