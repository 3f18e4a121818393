"""The Dramatiq driver: scenario jobs through ``dramatiq_ext.OjsRetries`` on any Dramatiq broker.

``DramatiqDriver("memory", folder)`` runs a ``StubBroker`` and an in-process
``dramatiq.Worker``; ``redis://...`` and ``amqp://...`` run a real broker, in a
Redis namespace and with queue names of the run's own, all removed by ``stop()``.

- One actor, ``conformance_job``, whose body is ``conformance.script.run_script``;
  the middleware's jitter source is ``conformance.script.scripted_jitter``. Each
  job carries its scenario's policy as the message's ``retry_policy`` (none: the
  default policy applies), so ``OjsRetries`` validates it at enqueue (RET-16).
- Time limits: the actor's ``time_limit`` is ``TIME_LIMIT_MS`` (1 s). Dramatiq's
  ``TimeLimit`` interrupts a thread with an asynchronous exception, which Python
  delivers only between bytecodes: a ``timeout`` step's single ``time.sleep`` runs
  to its end (``script.TIMEOUT_SLEEP_SECONDS``) before the attempt fails with
  ``TimeLimitExceeded``, so such a scenario takes that long.
- Crashes (Redis and RabbitMQ): a ``crash`` step SIGKILLs its process, so every
  crash scenario gets a queue and a worker process of its own (``_dramatiq_worker``),
  which the driver restarts when it dies. RabbitMQ redelivers the dead worker's
  unacked message at once; Redis requeues it once the dead worker's heartbeat is
  older than ``CRASH_HEARTBEAT_MS``. Job records live in Redis (for RabbitMQ at
  ``OJS_RECORD_REDIS_URL``, see ``_dramatiq_setup``) so the replacement worker sees
  that the attempt was running and records it as lost (HANDLER_PANIC, RET-12).
- Dead letters are read from the broker's ``<queue>.XQ`` queues, never the record.

>>> import tempfile
>>> from pathlib import Path
>>> sorted(DramatiqDriver("memory", Path(tempfile.mkdtemp())).capabilities)
['time_limit']
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import IO, Any

import dramatiq
from dramatiq.broker import Broker
from dramatiq.message import Message

from conformance.driver import Driver
from conformance.drivers._dramatiq_setup import (
    TICK_MS,
    BrokerConfig,
    broker_kind,
    build_broker,
    declare_actor,
    pika_url,
)
from conformance.scenarios import Scenario
from dramatiq_ext import get_job_record

#: Worker threads of the in-process worker; every non-crash job of a run is in flight at once.
WORKER_THREADS = 8
#: How often the driver checks its crash workers for a death, in seconds.
MONITOR_INTERVAL = 0.05
#: Restarts allowed per crash worker in one run (a scenario crashes at most a few times).
MAX_RESTARTS = 10
#: Milliseconds ``stop()`` gives a worker to finish before it is abandoned or killed.
STOP_TIMEOUT_MS = 5000

_Actor = dramatiq.Actor[Any, Any]
_log = logging.getLogger(__name__)


def _crashes(scenario: Scenario) -> bool:
    return any(step.kind == "crash" for step in scenario.script)


class _CrashWorker:
    """One crash scenario's worker process, restarted after each death."""

    def __init__(self, argv: list[str], log_path: Path) -> None:
        self.argv = argv
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = -1
        self.given_up = False
        self._log: IO[bytes] | None = None

    def spawn(self) -> None:
        if self._log is None:
            self._log = self.log_path.open("ab")
        env = dict(os.environ)
        # A source checkout works too: the subprocess imports conformance from here.
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(self.argv, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env)
        self.restarts += 1

    def log_tail(self, size: int = 4000) -> str:
        """The end of the worker's output (tracebacks of a worker that cannot boot)."""
        try:
            return self.log_path.read_bytes()[-size:].decode(errors="replace")
        except OSError:
            return ""

    def dead(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_MS / 1000)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None


class DramatiqDriver(Driver):
    """Runs conformance jobs through ``OjsRetries`` on a StubBroker, Redis or RabbitMQ.

    Example::

        with DramatiqDriver("redis://127.0.0.1:6379/0", Path(folder)) as driver:
            driver.start(scenarios)
            job_id = driver.submit(scenarios[0], "job-1")
    """

    framework = "dramatiq"

    def __init__(self, broker_url: str, log_folder: Path) -> None:
        super().__init__(broker_url, log_folder)
        token = uuid.uuid4().hex[:10]
        self.config = BrokerConfig(broker_kind(broker_url), broker_url,
                                   f"ojs-conformance-{token}")
        self.queue = f"ojs_conformance_{token}"
        self._broker: Broker | None = None
        self._worker: dramatiq.Worker | None = None
        self._actor: _Actor | None = None
        self._crash_actors: dict[str, _Actor] = {}
        self._crash_workers: list[_CrashWorker] = []
        self._stopping = threading.Event()
        self._monitor: threading.Thread | None = None

    @property
    def capabilities(self) -> frozenset[str]:
        if self.config.kind == "stub":
            return frozenset({"time_limit"})
        return frozenset({"time_limit", "crash"})

    @property
    def queues(self) -> list[str]:
        """Every queue of this run: the shared one, then one per crash scenario."""
        return [self.queue, *(actor.queue_name for actor in self._crash_actors.values())]

    def start(self, scenarios: tuple[Scenario, ...]) -> None:
        crashing = [s for s in scenarios if _crashes(s)]
        if crashing and "crash" not in self.capabilities:
            raise ValueError(f"{self.broker_url} has no worker process to kill for "
                             f"{[s.id for s in crashing]}")
        try:
            self._start(crashing)
        except BaseException:
            self.stop()
            raise

    def _start(self, crashing: list[Scenario]) -> None:
        broker = self._broker = build_broker(self.config)
        self._actor = declare_actor(broker, actor_name="conformance_job", queue_name=self.queue)
        for n, scenario in enumerate(crashing):
            actor = self._crash_actors[scenario.id] = declare_actor(
                broker, actor_name=f"conformance_job_crash{n}", queue_name=f"{self.queue}_crash{n}")
            config = {"broker": self.config.to_json(), "actor": actor.actor_name,
                      "queue": actor.queue_name}
            argv = [sys.executable, "-m", "conformance.drivers._dramatiq_worker",
                    json.dumps(config)]
            self._crash_workers.append(
                _CrashWorker(argv, self.log_folder / f"worker-{actor.queue_name}.log"))
        # The in-process worker takes only the shared queue: a crash job would kill it.
        self._worker = dramatiq.Worker(broker, queues={self.queue}, worker_timeout=TICK_MS,
                                       worker_threads=WORKER_THREADS)
        self._worker.start()
        for crash_worker in self._crash_workers:
            crash_worker.spawn()
        if self._crash_workers:
            self._monitor = threading.Thread(target=self._restart_the_dead, daemon=True,
                                             name="ojs-conformance-crash-monitor")
            self._monitor.start()

    def _restart_the_dead(self) -> None:
        while not self._stopping.wait(MONITOR_INTERVAL):
            for crash_worker in self._crash_workers:
                if not crash_worker.dead():
                    continue
                if crash_worker.restarts < MAX_RESTARTS:
                    crash_worker.spawn()
                elif not crash_worker.given_up:
                    crash_worker.given_up = True
                    _log.error("Crash worker died %d times; not restarting it. Its log:\n%s",
                               crash_worker.restarts + 1, crash_worker.log_tail())

    def stop(self) -> None:
        self._stopping.set()
        if self._monitor is not None:
            self._monitor.join()
            self._monitor = None
        for crash_worker in self._crash_workers:
            crash_worker.stop()
        if self._worker is not None:
            self._worker.stop(timeout=STOP_TIMEOUT_MS)
            self._worker = None
        if self._broker is not None:
            try:
                self._remove_broker_state()
            finally:
                self._broker.close()
                self._broker = None

    def submit(self, scenario: Scenario, job_key: str) -> str:
        actor = self._crash_actors.get(scenario.id) or self._actor
        if actor is None:
            raise RuntimeError("start() the driver before submitting jobs")
        options: dict[str, Any] = {}
        if scenario.policy is not None:
            options["retry_policy"] = dict(scenario.policy)
        script = [step.to_json() for step in scenario.script]
        message = actor.send_with_options(
            args=(job_key, script, str(self.log_folder), scenario.jitter_sample), **options)
        return message.message_id

    def job_record(self, job_id: str) -> dict[str, Any] | None:
        if self._broker is None:
            raise RuntimeError("the driver is not running")
        record = get_job_record(job_id, broker=self._broker)
        return None if record is None else record.to_dict()

    def dead_lettered_ids(self) -> set[str]:
        if self.config.kind == "stub":
            dead = getattr(self._broker, "dead_letters_by_queue", {})
            return {proxy.message_id for queue in self.queues for proxy in dead.get(queue, ())}
        if self.config.kind == "redis":
            return self._redis_dead_letters()
        return self._rabbitmq_dead_letters()

    # -- reading and removing broker state ------------------------------------------------

    def _redis_dead_letters(self) -> set[str]:
        client = _redis_client(self.broker_url)
        try:
            out: set[str] = set()
            for queue in self.queues:
                key = f"{self.config.namespace}:{queue}.XQ"
                ids = client.zrange(key, 0, -1)
                if ids:
                    out |= {Message.decode(data).message_id
                            for data in client.hmget(f"{key}.msgs", ids) if data is not None}
            return out
        finally:
            client.close()

    def _rabbitmq_dead_letters(self) -> set[str]:
        """Ids in the ``.XQ`` queues, read without acking: closing the channel puts them back."""
        import pika

        out: set[str] = set()
        connection = pika.BlockingConnection(pika.URLParameters(pika_url(self.broker_url)))
        try:
            for queue in self.queues:
                channel = connection.channel()
                try:
                    while True:
                        method, _properties, body = channel.basic_get(f"{queue}.XQ",
                                                                      auto_ack=False)
                        if method is None:
                            break
                        out.add(Message.decode(body).message_id)
                except pika.exceptions.ChannelClosedByBroker:  # no such queue: nothing dead
                    continue
                if channel.is_open:
                    channel.close()
        finally:
            connection.close()
        return out

    def _remove_broker_state(self) -> None:
        """Delete this run's Redis keys and RabbitMQ queues, and nothing else."""
        if self.config.kind == "stub":
            return
        if self.config.kind == "rabbitmq":
            import pika

            from conformance.drivers._dramatiq_setup import RECORD_REDIS_URL

            connection = pika.BlockingConnection(pika.URLParameters(pika_url(self.broker_url)))
            try:
                channel = connection.channel()
                for queue in self.queues:
                    for name in (queue, f"{queue}.DQ", f"{queue}.XQ"):
                        channel.queue_delete(name)
            finally:
                connection.close()
            redis_url = RECORD_REDIS_URL
        else:
            redis_url = self.broker_url
        client = _redis_client(redis_url)
        try:
            keys = list(client.scan_iter(match=f"{self.config.namespace}:*", count=500))
            if keys:
                client.delete(*keys)
        finally:
            client.close()


def _redis_client(url: str) -> Any:
    import redis

    return redis.Redis.from_url(url)
