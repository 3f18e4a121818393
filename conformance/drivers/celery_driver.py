"""The Celery driver: scenario jobs through ``celery_ext.OjsTask`` on memory://, Redis or RabbitMQ.

``CeleryDriver("memory", folder)`` runs kombu's ``memory://`` broker with a
``cache+memory://`` result backend and an embedded worker (threads pool) in
this process, so tests that patch the core in process see the patch in the
worker. ``redis://...`` and ``amqp://...`` run one real prefork worker in a
subprocess (``_celery_worker``); the job records live in Redis (the broker's
own, or ``OJS_RECORD_REDIS_URL`` for RabbitMQ, see ``_celery_app``).

- One task, ``ojs_conformance.job`` (base ``OjsTask``), whose body is
  ``conformance.script.run_script``; the app's ``ojs_jitter_source`` returns
  the job's ``jitter_sample`` argument. ``submit`` passes the scenario's policy
  as the per-call ``retry_policy``, which ``OjsTask.apply_async`` validates
  before anything is sent (RET-16).
- Crashes and time limits (Redis and RabbitMQ): a ``crash`` step SIGKILLs its
  pool process; the task's hard time limit is ``TIME_LIMIT_SECONDS`` (1 s). The
  prefork pool replaces the dead process and the adapter counts the attempt
  (RET-12). On ``memory://`` neither is possible: its broker lives in this
  process, so a prefork child could not reach it, and the threads pool has no
  time limits.
- Dead letters are read from the broker's ``<queue>.dead_letter`` queue
  (without consuming them), never from the record.
- Isolation: each run has queue names and a Redis key prefix of its own;
  ``stop()`` deletes those queues and keys and nothing else. Stopping the
  embedded ``memory://`` worker raises Celery's process-wide shutdown flag
  (as ``celery.contrib.testing`` does), which stops any other embedded Celery
  worker of the process too.

>>> import tempfile
>>> from pathlib import Path
>>> sorted(CeleryDriver("redis://127.0.0.1:6379/0", Path(tempfile.mkdtemp())).capabilities)
['crash', 'time_limit']
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import Any

from celery import Celery
from celery.contrib.testing.worker import start_worker
from celery.worker import state as worker_state

from celery_ext import get_job_record
from celery_ext.records import RecordStore
from conformance.driver import Driver
from conformance.drivers._celery_app import (
    RECORD_REDIS_URL,
    TASK_NAME,
    WAKE_TASK_NAME,
    AppConfig,
    build_app,
)
from conformance.drivers._celery_broker import (
    broker_kind,
    delete_queues,
    delete_redis_keys,
    task_ids_in_queue,
)
from conformance.drivers._celery_worker import CONFIG_ENV
from conformance.scenarios import Scenario

#: Threads of the in-process ``memory://`` worker; every job of a run is in flight at once.
WORKER_THREADS = 8
#: Pool processes of the prefork worker subprocess (Redis, RabbitMQ).
POOL_PROCESSES = 4
#: Seconds to wait for the worker subprocess to say it is ready.
READY_TIMEOUT = 60.0
#: Seconds ``stop()`` gives a worker to shut down before it is killed.
STOP_TIMEOUT = 10.0


class CeleryDriver(Driver):
    """Runs conformance jobs through ``OjsTask`` on memory://, Redis or RabbitMQ.

    Example::

        with CeleryDriver("amqp://guest:guest@127.0.0.1:5672//", Path(folder)) as driver:
            driver.start(scenarios)
            task_id = driver.submit(scenarios[0], "job-1")
            record = driver.job_record(task_id)
    """

    framework = "celery"

    def __init__(self, broker_url: str, log_folder: Path) -> None:
        super().__init__(broker_url, log_folder)
        self.kind = broker_kind(broker_url)
        token = uuid.uuid4().hex[:10]
        backend = {"memory": "cache+memory://", "redis": broker_url,
                   "amqp": RECORD_REDIS_URL}[self.kind]
        self.config = AppConfig(broker_url="memory://" if self.kind == "memory" else broker_url,
                                backend_url=backend, prefix=f"ojs-conformance-{token}",
                                queue=f"ojs_conformance_{token}")
        self.app: Celery | None = None
        self._embedded = ExitStack()
        self._embedded_worker: Any = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._job_ids: list[str] = []

    @property
    def capabilities(self) -> frozenset[str]:
        if self.kind == "memory":
            return frozenset()
        return frozenset({"crash", "time_limit"})

    @property
    def dead_letter_queue(self) -> str:
        """The run's dead-letter queue (the adapter's default ``<queue>.dead_letter``)."""
        return f"{self.config.queue}.dead_letter"

    @property
    def worker_log(self) -> Path:
        """Where the worker subprocess writes its output."""
        return self.log_folder / f"worker-{self.config.queue}.log"

    # -- lifecycle ------------------------------------------------------------------------

    def start(self, scenarios: tuple[Scenario, ...]) -> None:
        needed = {need for s in scenarios for need in s.needs} - self.capabilities
        if needed:
            raise ValueError(f"{self.broker_url}: the Celery driver cannot {sorted(needed)}")
        self.app = build_app(self.config)
        try:
            if self.kind == "memory":
                self._embedded_worker = self._embedded.enter_context(start_worker(
                    self.app, pool="threads", concurrency=WORKER_THREADS,
                    perform_ping_check=False, queues=[self.config.queue], loglevel="WARNING",
                    shutdown_timeout=30))
            else:
                self._spawn_worker()
        except BaseException:
            self.stop()
            raise

    def _spawn_worker(self) -> None:
        env = dict(os.environ)
        env[CONFIG_ENV] = self.config.to_json()
        # A source checkout works too: the subprocess imports conformance from here.
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        argv = [sys.executable, "-m", "celery", "-A", "conformance.drivers._celery_worker",
                "worker", "-P", "prefork", "-c", str(POOL_PROCESSES), "-Q", self.config.queue,
                "-l", "INFO", "-n", f"{self.config.prefix}@%h", "--without-gossip",
                "--without-mingle", "--without-heartbeat"]
        with self.worker_log.open("wb") as out:
            self._proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, env=env,
                                          start_new_session=True)
        deadline = time.monotonic() + READY_TIMEOUT
        while b" ready." not in self.worker_log.read_bytes():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the Celery worker did not start; its log:\n"
                                   f"{self._log_tail()}")
            time.sleep(0.05)

    def _log_tail(self, size: int = 4000) -> str:
        try:
            return self.worker_log.read_bytes()[-size:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        if self._proc is not None:
            _stop_process_group(self._proc)
            self._proc = None
        if self.app is not None and self._embedded_worker is not None:
            # The embedded consumer checks the (process-wide) shutdown flag only between
            # messages: flag it, then send one, so it stops now rather than after a poll.
            worker_state.should_terminate = 0
            self.app.tasks[WAKE_TASK_NAME].apply_async()
        self._embedded.close()  # start_worker joins the thread and lowers the flag again
        self._embedded_worker = None
        if self.app is not None:
            try:
                self._remove_broker_state(self.app)
            finally:
                self.app.close()
                self.app = None

    # -- jobs -----------------------------------------------------------------------------

    def submit(self, scenario: Scenario, job_key: str) -> str:
        if self.app is None:
            raise RuntimeError("start() the driver before submitting jobs")
        options: dict[str, Any] = {}
        if scenario.policy is not None:
            options["retry_policy"] = dict(scenario.policy)
        kwargs = {"job_key": job_key, "script": [step.to_json() for step in scenario.script],
                  "log_folder": str(self.log_folder), "jitter_sample": scenario.jitter_sample}
        result = self.app.tasks[TASK_NAME].apply_async(kwargs=kwargs, **options)
        task_id = str(result.id)
        self._job_ids.append(task_id)
        return task_id

    def job_record(self, job_id: str) -> dict[str, Any] | None:
        if self.app is None:
            raise RuntimeError("the driver is not running")
        record = get_job_record(job_id, app=self.app)
        return None if record is None else record.to_dict()

    def dead_lettered_ids(self) -> set[str]:
        if self.app is None:
            raise RuntimeError("the driver is not running")
        return task_ids_in_queue(self.app, self.kind, self.dead_letter_queue,
                                 redis_prefix=self.config.prefix)

    def _remove_broker_state(self, app: Celery) -> None:
        """Delete this run's queues, exchange, records and Redis keys, and nothing else."""
        if self.kind != "redis":
            delete_queues(app, [self.config.queue, self.dead_letter_queue],
                          [self.config.queue])
        if self.kind != "memory":
            delete_redis_keys(self.config.backend_url, self.config.prefix)
            return
        store = RecordStore(app.backend)  # cache+memory:// is process-wide: forget ours
        for task_id in self._job_ids:
            store.delete(task_id)
            app.backend.forget(task_id)


def _stop_process_group(proc: subprocess.Popen[bytes]) -> None:
    """Warm-stop the worker; SIGKILL it and its pool processes if it lingers."""
    if proc.poll() is None:
        proc.terminate()
        with suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=STOP_TIMEOUT)
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # pool processes left behind, if any
    proc.wait()
