"""``admission.admit`` on the one-call path: what it parses of the stored record, and when."""

from __future__ import annotations

import contextlib
import logging
from typing import Any, NoReturn

import pytest

import ojs_adapters.runtime.admission as admission
from ojs_adapters import JobRecord
from ojs_adapters.runtime.claims import AdmissionReply
from ojs_adapters.runtime.handoff import Claim


class _Seat:
    """A delivery whose store answers ``reply`` to its one admission call."""

    attempt, rounds, label, logger = 2, (0, 0), "t[j]", logging.getLogger("test")

    def __init__(self, reply: AdmissionReply) -> None:
        self.reply, self.held = reply, False

    def begin(self, fresh: JobRecord | None, lease_ms: int | None) -> AdmissionReply:
        return self.reply

    def lease(self, ttl_ms: int) -> bool | None:
        raise AssertionError("the one call took the lease")

    def load(self) -> JobRecord | None:
        raise AssertionError("the one call read the record")

    def claim(self) -> Claim:
        raise AssertionError("the one call claimed")

    def hold_lease(self) -> None:
        self.held = True

    def waiting(self) -> Any:
        return contextlib.nullcontext()

    def give_back(self, why: str) -> NoReturn:
        raise AssertionError(why)


PREVIOUS = JobRecord("j", "t", "q", 3).started(1)


def test_a_written_start_runs_and_leaves_the_previous_record_unparsed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``wrote``: the script wrote ``active`` over an earlier attempt's record, so the
    verdict is "run" with no parse; ``stored()`` still gives that record (Celery undoes
    ``active`` with it on ``Reject(requeue=True)``)."""
    parsed: list[Any] = []
    monkeypatch.setattr(admission, "record_of", lambda raw: parsed.append(raw))
    seat = _Seat(AdmissionReply("new", PREVIOUS.to_json(), True, True))
    found = admission.admit(seat, PREVIOUS.started(2), deadline=lambda: 0.0)
    assert (found.verdict, found.record, found.wrote, seat.held) == ("run", None, True, True)
    assert parsed == []
    monkeypatch.undo()
    assert found.stored() == PREVIOUS


@pytest.mark.parametrize(("claim", "stored", "verdict"), [
    ("mine", PREVIOUS.started(2), "lost"),  # its own earlier delivery started it: a crash
    ("other", PREVIOUS, "duplicate"),
    ("new", PREVIOUS.started(2).completed(), "duplicate"),
])
def test_a_start_not_written_is_judged_on_the_parsed_record(
        claim: str, stored: JobRecord, verdict: str) -> None:
    seat = _Seat(AdmissionReply(claim, stored.to_json(), False, True))  # type: ignore[arg-type]
    found = admission.admit(seat, PREVIOUS.started(2), deadline=lambda: 0.0)
    assert (found.verdict, found.record, found.wrote) == (verdict, stored, False)
    assert found.stored() == stored
