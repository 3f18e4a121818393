"""``OjsRequest`` tells a hard time limit from a pool process that had already died (RET-12).

The prefork pool notices a dead process only when it next looks, which can
be after the task's hard time limit fired; the attempt was then lost to a
crash (``HANDLER_PANIC``), not to the limit (``HANDLER_TIMEOUT``). The check
must not reap the process: billiard does that.
"""

from __future__ import annotations

import subprocess
import sys

from celery_ext._request import _pool_process_exited
from tests.celery_ext.support import wait_for


def test_ret12_an_exited_process_is_seen_without_being_reaped() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    wait_for(lambda: _pool_process_exited(proc.pid), timeout=10)
    assert proc.wait(timeout=5) == 0  # still a zombie until now: the check did not reap it
    assert _pool_process_exited(proc.pid)  # reaped and gone


def test_ret12_a_running_process_has_not_exited() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert not _pool_process_exited(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert not _pool_process_exited(None)
