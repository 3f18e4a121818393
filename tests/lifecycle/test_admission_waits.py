"""Issue 17: what a delivery does while it cannot be admitted, the same on both frameworks.

Nothing runs without its lease and its claim: running unclaimed could run one attempt
twice, and running unleased could have a twin delivery count a live attempt as lost
(a phantom ``HANDLER_PANIC``, RET-12). So a delivery that cannot take them waits,
nothing run, and past ``CLAIM_WAIT_SECONDS`` (never past its time limit less
``LIMIT_MARGIN``) is given back to the broker unrun, announced in a WARNING that names
the task, and tries again on its next delivery:

- **the record store is out of reach** at admission (its traffic goes through a proxy
  the test cuts; the broker stays up): the job never runs while it is cut, is given back
  again and again, and runs exactly once when the store answers, with no error entry;
- **another live delivery holds the attempt's lease** (the test holds it, renewing it, as
  a twin delivery would): the waiting delivery is given back within its time limit
  (``CLAIM_WAIT_SECONDS`` set far beyond it shows which bound acts), never ends as a
  ``HANDLER_TIMEOUT`` of an attempt that did not run, and runs once the holder is gone.

``CLAIM_WAIT_SECONDS`` is shortened per test (both adapters admit with
``ojs_adapters.runtime.admission``, which reads it at each use).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import ojs_adapters.runtime.admission as admission
from tests.handoff.proxy import Proxy
from tests.lifecycle.lanes import open_lane, wait_until

#: The lease holder of the twin delivery: ``<copy token>|<delivery nonce>``, as adapters write.
TWIN = "twin-copy|twin-delivery"


def _ok(payload: dict[str, Any], attempt: int) -> str:
    return "done"


@pytest.fixture
def store_proxy() -> Iterator[Proxy]:
    proxy = Proxy("127.0.0.1", 6379)
    try:
        yield proxy
    finally:
        proxy.close()


def _claim_wait(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    monkeypatch.setattr(admission, "CLAIM_WAIT_SECONDS", seconds)  # both adapters admit here


@pytest.mark.broker
def test_issue17_store_out_of_reach_at_admission_runs_nothing_until_it_answers(
        lane_kind: tuple[str, str], store_proxy: Proxy,
        monkeypatch: pytest.MonkeyPatch) -> None:
    _claim_wait(monkeypatch, 1.0)
    store_url = f"redis://127.0.0.1:{store_proxy.port}/0"
    with open_lane(*lane_kind, store_url=store_url) as lane:
        job = lane.declare(_ok)
        lane.start()
        name = lane.name_of(job)
        store_proxy.cut()
        job_id = lane.send(job, {"order": 9})

        given_back = wait_until(lambda: len(lane.logs.lines(
            name, job_id, "not run: the job store is out of reach",
            "given back to the broker")) >= 2, timeout=60, what="given back twice")
        given_back = len(lane.logs.lines(name, job_id, "given back to the broker"))
        runs_while_cut = list(lane.runs[job_id])
        store_proxy.restore()
        record = lane.wait_record(job_id, lambda r: r.state == "completed", timeout=60)
        runs = list(lane.runs[job_id])

    print(f"\n{lane.framework} {lane.kind}: given back {given_back}x, runs while cut "
          f"{runs_while_cut}, then {runs}; record {record.state} at {record.attempt}")
    assert runs_while_cut == [], "nothing runs unclaimed while the store is out of reach"
    assert runs == [1], "it runs once, when the store answers"
    assert (record.state, record.attempt, record.errors) == ("completed", 1, ())


@pytest.mark.broker
def test_issue17_a_live_delivery_s_lease_is_waited_for_within_the_time_limit(
        lane_kind: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """``CLAIM_WAIT_SECONDS`` far beyond the 2 s time limit: the give-back can only come
    from the limit. (Celery's threads pool does not enforce limits: the adapter reads
    the task's ``time_limit`` all the same, as under prefork, where the wait counts.)"""
    _claim_wait(monkeypatch, 600.0)
    with open_lane(*lane_kind) as lane:
        job = lane.declare(_ok, time_limit=2.0)
        lane.start()
        name = lane.name_of(job)
        job_id = str(uuid.uuid4())
        gone = threading.Event()

        def twin() -> None:  # another live delivery of attempt 1, renewing its lease
            while not gone.wait(0.3):
                lane.take_lease(job_id, 1, TWIN, 1500)

        assert lane.take_lease(job_id, 1, TWIN, 1500) is True
        holder = threading.Thread(target=twin, daemon=True)
        holder.start()
        try:
            lane.send(job, {"order": 10}, job_id=job_id)
            given_back = wait_until(lambda: lane.logs.lines(
                name, job_id, "not run: another delivery of attempt 1 is alive",
                "given back to the broker"), timeout=60, what="given back within the limit")
            waited = lane.logs.lines(name, job_id, "waits, not run")
            runs_while_held = list(lane.runs[job_id])
        finally:
            gone.set()  # the twin is gone: its lease lapses
            holder.join(timeout=5)
        record = lane.wait_record(job_id, lambda r: r.state == "completed", timeout=60)
        runs = list(lane.runs[job_id])

    print(f"\n{lane.framework} {lane.kind}: {given_back[0]!r}; runs while held "
          f"{runs_while_held}, then {runs}; record {record.state}, errors {record.errors}")
    assert waited, "the wait is said, with the task name"
    assert runs_while_held == [], "nothing runs while another live delivery holds the lease"
    assert runs == [1]
    assert (record.state, record.attempt, record.errors) == ("completed", 1, ()), \
        "no HANDLER_TIMEOUT or HANDLER_PANIC for an attempt that only waited"
