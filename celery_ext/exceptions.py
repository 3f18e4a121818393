"""The exceptions an ``OjsTask`` ends with when the policy says stop.

``AsyncResult.get()`` raises one of these for a discarded, failed or
dead-lettered job. With the JSON result serializer Celery keeps only an
exception's type, module and ``args`` (``backends/base.py``
``prepare_exception``), so everything these classes carry lives in ``args``:
``(message, record_dict)``. ``exception_to_python`` calls ``cls(*args)`` and
the rebuilt exception has its ``record`` again, whatever the serializer.

>>> from ojs_adapters import JobRecord
>>> rec = JobRecord(id="t1", type="app.pay", queue="q", max_attempts=1, state="discarded",
...                 outcome="discarded")
>>> exc = JobDiscarded("app.pay[t1] discarded", rec.to_dict())
>>> (exc.record.outcome, exc.outcome, type(exc)(*exc.args).record.id)
('discarded', 'discarded', 't1')
>>> exc
JobDiscarded('app.pay[t1] discarded')
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ojs_adapters import JobRecord, OjsValidationError


class JobDiscarded(Exception):
    """The job ended without success and will not run again (discard or ``FAIL``).

    ``record`` is the final ``JobRecord`` (errors, attempts, outcome);
    ``outcome`` is ``"discarded"``, ``"failed"`` or ``"dead_letter"``.
    """

    def __init__(self, message: str, record: Mapping[str, Any]) -> None:
        super().__init__(message, dict(record))
        self.record: JobRecord = JobRecord.from_dict(record)

    @property
    def outcome(self) -> str | None:
        """How the job ended, from the record."""
        return self.record.outcome

    def __str__(self) -> str:
        return str(self.args[0])

    def __repr__(self) -> str:
        # Celery's worker log shows ``repr(exc)`` ("raised unexpected: ..."): the sentence,
        # not the whole record held in ``args`` (it reaches the result backend as ever).
        return f"{type(self).__name__}({self.args[0]!r})"


class JobDeadLettered(JobDiscarded):
    """The job went to its dead-letter queue (``on_exhaustion: dead_letter``, ``DEAD_LETTER``).

    ``record.extra["dead_letter_queue"]`` names the queue that holds it.
    """


class RetryRefused(OjsValidationError):
    """``OjsTask.retry(...)`` was given an argument the OJS policy cannot honour
    (``throw=False``, a routing or time-limit option, arguments JSON cannot hold).

    ``details`` names the ``field`` and the ``rule``. Raised in the task body; if it
    leaves the body the job is dead-lettered (kept for a person, whatever
    ``on_exhaustion`` says), never dropped.
    """

    def __init__(self, message: str, *, field: str = "", rule: str = "") -> None:
        super().__init__(message, code="INVALID_ARGS", details={"field": field, "rule": rule})

    def __reduce__(self) -> Any:  # pickled whole (an eager result), not rebuilt as cls(message)
        return (_rebuild_refused, (self.message, self.details.get("field", ""),
                                   self.details.get("rule", "")))


def _rebuild_refused(message: str, field: str, rule: str) -> RetryRefused:
    return RetryRefused(message, field=field, rule=rule)
