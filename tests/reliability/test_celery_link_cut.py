"""Issue 8, Celery: the broker link drops while attempts run; nothing runs twice, no phantom crash.

A ``celery worker`` subprocess (threads pool) consumes through a ``Proxy`` the test
cuts while ``JOBS`` attempts run (``celery_link_app``: each sleeps ``SLEEP`` s). The
broker hands the running messages out again on the new connection (RabbitMQ gives
back the unacked deliveries of a closed channel; on Redis the visibility heartbeat
puts back the deliveries of a closed channel, ``celery_ext._orphans``), while the
first deliveries go on running. Each second delivery must wait for the live one (the
attempt lease, ``ojs_adapters.runtime.leases``) and then be dropped as a duplicate: every job
completed at attempt 1 with no error entry, each body ran once, and no retry was
decided. Before the lease, each such copy was judged a crashed worker (a phantom
``HANDLER_PANIC`` retry), and its attempt 2 could run the body again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from celery_ext.records import RecordStore
from tests.brokers import AMQP_URL, REDIS_URL
from tests.handoff.proxy import Proxy
from tests.reliability.celery_link_app import CONFIG_ENV, TASK_NAME, build_app
from tests.restart.support import RunLog, wait_for

pytestmark = [pytest.mark.broker, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
#: Jobs running when the link drops (the pool has room for their second deliveries).
JOBS = 3
#: How long each attempt runs, seconds.
SLEEP = 5.0
#: How long the link stays down, seconds.
DOWN = 1.0


@pytest.fixture(params=["amqp", "redis"])
def kind(request: pytest.FixtureRequest) -> str:
    request.getfixturevalue("amqp_url" if request.param == "amqp" else "redis_url")
    request.getfixturevalue("redis_url")  # the records
    return str(request.param)


@pytest.fixture
def worker_log(tmp_path: Path) -> Iterator[Path]:
    log = tmp_path / "worker.log"
    yield log
    if os.environ.get("OJS_TEST_SHOW_LOGS"):
        print(log.read_text(errors="replace")[-8000:])


def test_issue8_ret12_a_dropped_link_is_no_crash_and_runs_nothing_twice(
        kind: str, tmp_path: Path, worker_log: Path) -> None:
    proxy = Proxy("127.0.0.1", 5672 if kind == "amqp" else 6379)
    through = (f"amqp://guest:guest@127.0.0.1:{proxy.port}//" if kind == "amqp"
               else f"redis://127.0.0.1:{proxy.port}/0")
    queue = f"ojs-link-{uuid.uuid4().hex[:8]}"
    config = {"broker": through, "backend": REDIS_URL, "queue": queue,
              "runs": str(tmp_path / "runs")}
    log = RunLog(Path(config["runs"]))
    app = build_app({**config, "broker": AMQP_URL if kind == "amqp" else REDIS_URL})
    store = RecordStore(app.backend)
    env = {**os.environ, CONFIG_ENV: json.dumps(config), "PYTHONPATH": str(ROOT)}
    with worker_log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tests.reliability.celery_link_app", "worker",
             "-P", "threads", "-c", str(2 * JOBS + 2), "-Q", queue, "-l", "INFO",
             "-n", f"link-{uuid.uuid4().hex[:6]}@%h", "--without-gossip", "--without-mingle",
             "--without-heartbeat"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: b" ready." in worker_log.read_bytes() or proc.poll() is not None,
                 timeout=60, what="celery worker ready")
        assert proc.poll() is None, worker_log.read_text()
        keys = [f"job-{i}" for i in range(JOBS)]
        ids = [app.tasks[TASK_NAME].apply_async((key, SLEEP), queue=queue).id for key in keys]
        wait_for(lambda: len(log.runs()) == JOBS, timeout=20, what="every attempt running")
        proxy.cut()
        time.sleep(DOWN)
        proxy.restore()
        wait_for(lambda: all((r := store.load(i)) is not None and r.state == "completed"
                             for i in ids), timeout=SLEEP + 30, what="every job completed")
        text = wait_for(  # the fault happened: every message was handed out a second time
            lambda: (t := worker_log.read_text(errors="replace")).count(
                "dropping duplicate") >= JOBS and t,
            timeout=15, what="the second deliveries dropped as duplicates")
        time.sleep(1.5)  # a phantom retry (0.5 s) would run by now
        text = worker_log.read_text(errors="replace")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proxy.close()
        with app.connection_for_write() as conn:
            conn.default_channel.queue_delete(queue)
    assert sorted((run.key, run.attempt) for run in log.runs()) == [(k, 1) for k in keys]
    for job_id in ids:
        record = store.load(job_id)
        assert record is not None
        assert (record.state, record.attempt, record.errors) == ("completed", 1, ())
    assert "ojs retry decision" not in text  # no attempt was taken for a crash
