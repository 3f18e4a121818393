"""Helpers shared by the driver tests."""

from __future__ import annotations

import time
from typing import Any

from conformance.driver import Driver
from conformance.runner import TERMINAL_STATES


def wait_terminal(driver: Driver, job_id: str, timeout: float = 20.0) -> dict[str, Any]:
    """The job's record once it is completed or discarded; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        record = driver.job_record(job_id)
        if record is not None and record["state"] in TERMINAL_STATES:
            return record
        assert time.monotonic() < deadline, f"job {job_id} never finished: {record}"
        time.sleep(0.05)
