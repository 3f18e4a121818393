"""The values a migration produces: ``Note`` and ``Migration`` (with its ``Fidelity``).

A ``Migration`` is the OJS policy chosen for one job's retry settings in another
dialect, every lossy or approximate step in plain words (``notes``), and a
comparison of the old and new delay schedules (``fidelity``). A migration is
``lossy`` when a note says so or when the new schedule is not ``faithful``:
fidelity is judged on the whole schedule, retry by retry and over the total
retry window, against the tolerances below. A faithful schedule whose early
retries come much sooner than the source's (``Fidelity.hurried``) is not
lossy, but its ``verdict`` is ``approximate``, not ``ok``. The schedule comparison
lives in ``_fidelity``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ojs_adapters.failure import HandlerCode
from ojs_adapters.migrate._fidelity import Fidelity
from ojs_adapters.policy import RetryPolicy

#: How far a step strays from the source: ``info`` changes nothing, ``approximate``
#: keeps the intent with different numbers, ``lossy`` drops behaviour, and
#: ``unsupported`` means OJS has no equivalent and nothing was guessed.
Severity = Literal["info", "approximate", "lossy", "unsupported"]
SEVERITIES: tuple[Severity, ...] = ("info", "approximate", "lossy", "unsupported")
#: Severities that make a migration lossy (unless the caller asked for the step).
LOSSY: frozenset[Severity] = frozenset({"lossy", "unsupported"})
#: What a migration's schedule keeps, best first: ``exact``; ``ok``, approximate with its
#: intent kept; ``approximate``, kept but with early retries much sooner than the source's;
#: ``lossy``; ``unsupported``, no policy at all.
Verdict = Literal["exact", "ok", "approximate", "lossy", "unsupported"]


@dataclass(frozen=True, slots=True)
class Note:
    """One remark on a translation step, tied to the source option it concerns.

    ``asked`` marks a step the caller chose (a cap for unbounded retries): it
    keeps its severity but does not make the migration lossy.

    >>> str(Note("lossy", "retry_when", "a predicate is code; it was not translated"))
    'lossy: retry_when: a predicate is code; it was not translated'
    """

    severity: Severity
    field: str | None
    text: str
    asked: bool = False

    def __str__(self) -> str:
        where = f"{self.field}: " if self.field else ""
        return f"{self.severity}{' (asked)' if self.asked else ''}: {where}{self.text}"

    @property
    def lossy(self) -> bool:
        """Whether this step drops behaviour the caller did not agree to drop."""
        return self.severity in LOSSY and not self.asked

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON for ``ojs-retry migrate --json``."""
        return {"severity": self.severity, "field": self.field, "text": self.text,
                "asked": self.asked}


@dataclass(frozen=True)
class Migration:
    """One translated job: the OJS ``policy``, the ``notes`` and the ``fidelity``.

    ``policy`` is ``None`` when the source has no OJS equivalent (an unbounded
    retry count, a retry predicate) and no stand-in was asked for; the notes
    say why. ``handler_codes`` maps error types to the response code a handler
    must raise (``JobError(type, code=...)``) to keep per-error behaviour the
    policy cannot hold. ``ok`` holds only when there is a policy and the
    migration is not ``lossy``. ``app_wide`` marks an app's default rather than one
    job's (Sidekiq's ``default_job_options`` or ``max_retries``).

    >>> from ojs_adapters.migrate import from_faktory
    >>> m = from_faktory({"retry": -1})
    >>> (m.policy.max_attempts, m.policy.on_exhaustion)
    (1, 'dead_letter')
    """

    dialect: str
    policy: RetryPolicy | None
    notes: tuple[Note, ...] = ()
    fidelity: Fidelity | None = None
    handler_codes: Mapping[str, HandlerCode] = field(default_factory=dict, hash=False)
    name: str | None = None
    origin: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)
    app_wide: bool = False

    @property
    def lossy(self) -> bool:
        """A note drops behaviour not asked for, or the schedule is not ``faithful``."""
        return (any(note.lossy for note in self.notes)
                or (self.fidelity is not None and not self.fidelity.faithful))

    @property
    def ok(self) -> bool:
        """There is a policy and nothing was lost: it can be used as it is."""
        return self.policy is not None and not self.lossy

    @property
    def exact(self) -> bool:
        """A policy exists, every note is ``info`` and the schedules agree."""
        return (self.policy is not None
                and all(note.severity == "info" for note in self.notes)
                and (self.fidelity is None or self.fidelity.exact))

    @property
    def verdict(self) -> Verdict:
        """One word for the translation (``Verdict``); ``ok`` and ``approximate`` are both
        ``ok`` (usable as they are), ``approximate`` asks for a look at the notes."""
        if self.policy is None:
            return "unsupported"
        if self.lossy:
            return "lossy"
        if self.exact:
            return "exact"
        return "approximate" if self.fidelity is not None and self.fidelity.hurried else "ok"

    def notes_at_least(self, severity: Severity) -> tuple[Note, ...]:
        """The notes at ``severity`` or worse."""
        floor = SEVERITIES.index(severity)
        return tuple(n for n in self.notes if SEVERITIES.index(n.severity) >= floor)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON: what ``ojs-retry migrate --json`` prints for each job."""
        return {
            "dialect": self.dialect,
            "name": self.name,
            "origin": self.origin,
            "app_wide": self.app_wide,
            "ok": self.ok,
            "verdict": self.verdict,
            "lossy": self.lossy,
            "exact": self.exact,
            "policy": None if self.policy is None else self.policy.to_dict(),
            "handler_codes": dict(self.handler_codes),
            "notes": [note.to_dict() for note in self.notes],
            "fidelity": None if self.fidelity is None else self.fidelity.to_dict(),
        }
