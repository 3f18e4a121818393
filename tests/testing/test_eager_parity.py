"""An eager Celery run inside ``instant_retries()`` stores the record a worker stores.

The eager path (``celery_ext._eager``) runs the attempts in the caller instead of
through the broker; this test keeps it honest. The same task, the same jobs and the
same jitter run once on a real in-process worker (``memory://``, short countdowns)
and once eagerly; the records must be equal but for what differs by nature: ids,
timestamps, the idempotency key and the worker's ``handed_off`` mark of a published
dead letter (eager mode publishes none).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker

from celery_ext import JobDeadLettered, OjsTask, get_job_record
from ojs_adapters import JobError, JobRecord
from ojs_adapters.testing import instant_retries

pytestmark = pytest.mark.slow

#: Differ by nature between two runs of one job (see the module docstring).
VOLATILE = {"id", "updated_at", "idempotency_key", "handed_off", "next_retry_at"}


def _comparable(record: JobRecord | None) -> dict[str, Any]:
    assert record is not None
    data = {k: v for k, v in record.to_dict().items() if k not in VOLATILE}
    data["errors"] = [{k: v for k, v in e.items() if k not in ("occurred_at", "timestamp")}
                      for e in data["errors"]]
    return data


def _settled(app: Celery, task_id: str, ready: Mapping[str, Any]) -> JobRecord:
    """The worker's final record (the dead letter's mark lands just after the result)."""
    deadline = time.monotonic() + 10
    while True:
        record = get_job_record(task_id, app=app)
        if record is not None and all(record.extra.get(k) == v if v is not None
                                      else k in record.extra for k, v in ready.items()):
            return record
        assert time.monotonic() < deadline, record
        time.sleep(0.02)


def test_ret14_eager_records_equal_a_workers() -> None:
    app = Celery(f"parity-{uuid.uuid4().hex[:8]}", broker="memory://",
                 backend="cache+memory://", set_as_current=False)
    app.conf.ojs_jitter_source = lambda: 0.5  # the worker's jitter, pinned as instant's is
    app.conf.broker_transport_options = {"polling_interval": 0.01}

    @app.task(shared=False, base=OjsTask, bind=True, name="parity.charge", retry_policy={
        "max_attempts": 3, "initial_interval": "PT0.05S", "on_exhaustion": "dead_letter"})
    def charge(self: Any, failures: int) -> str:
        if self.ojs.attempt <= failures:
            raise JobError("payment.card_declined", f"attempt {self.ojs.attempt}")
        return "charged"

    with start_worker(app, pool="solo", perform_ping_check=False, loglevel="WARNING",
                      shutdown_timeout=10):
        recovered, dead = charge.delay(2), charge.delay(9)
        assert recovered.get(timeout=10) == "charged"
        with pytest.raises(JobDeadLettered):
            dead.get(timeout=10)
        worker = {"recovered": _settled(app, recovered.id, {}),
                  "dead": _settled(app, dead.id, {"handed_off": None})}

    app.conf.task_always_eager = True
    with instant_retries(jitter_sample=0.5) as retries:
        eager = {"recovered": charge.delay(2).id, "dead": charge.delay(9).id}
    for job in ("recovered", "dead"):
        assert _comparable(retries.record(eager[job])) == _comparable(worker[job]), job
    assert retries.countdowns(eager["dead"]) == worker["dead"].extra["countdowns"] == [0.05, 0.1]
