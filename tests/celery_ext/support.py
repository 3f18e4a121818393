"""Test support for celery_ext: an app per broker, its tasks, and what they saw.

Every app gets the same tasks (``register_tasks``). A task's behaviour per
attempt comes from a *script* passed as its argument, one step per attempt
(the last step repeats): ``"ok"``, ``"raise:<kind>"``, ``"retry:<countdown>"``,
``"reject-once"``, ``"ignore"``, ``"reject"``, ``"sleep:<seconds>"`` or
``"replace:<step>|<step>"`` (the task replaces itself with a run of that script).
Each run is recorded in ``RUNS[task_id]`` (in-process workers only).

Broker isolation: each app has a unique Redis ``global_keyprefix`` and unique
queue names, so tests never see other engineers' messages and clean up only
what they created.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

from celery import Celery, chain
from celery.exceptions import Ignore, Reject
from celery.worker import state as worker_state
from kombu import Connection

from celery_ext import OjsTask
from celery_ext._headers import HeaderState
from ojs_adapters import JobError
from tests.celery_ext import retry_steps

#: Seed of the jitter source of the ``timed`` task.
JITTER_SEED = 20260212
#: Policy of the ``timed`` task (jitter on, so the seeded sample matters).
TIMED_POLICY = {"max_attempts": 4, "initial_interval": "PT0.2S", "backoff_coefficient": 1.5,
                "max_interval": "PT1S", "jitter": True}
#: Policy of the ``scripted`` task; calls override parts of it.
SCRIPTED_POLICY = {"max_attempts": 3, "initial_interval": "PT0.1S", "jitter": False}
#: App-wide default policy of every test app (merged under the task policies).
APP_DEFAULT_POLICY = {"max_interval": "PT2S", "backoff_coefficient": 1.0}


class PaymentError(Exception):
    """A base class that a non_retryable_errors entry can name."""


class CardStolen(PaymentError):
    """Subclass of PaymentError: matches the base-class entry."""


@dataclass(frozen=True)
class Run:
    """One execution of a task body as the task saw it."""

    attempt: int
    started: float
    delivery_info: dict[str, Any]
    eta: str | None
    ended: float | None = None


#: Runs per task id, appended by the tasks (in-process workers only).
RUNS: dict[str, list[Run]] = defaultdict(list)
_LOCK = threading.Lock()


def _record(task: Any) -> int:
    attempt = HeaderState.from_headers(task.request.headers).attempt
    run = Run(attempt, time.time(), dict(task.request.delivery_info or {}), task.request.eta)
    with _LOCK:
        RUNS[task.request.id].append(run)
    return attempt


def _failure(kind: str) -> BaseException:
    if kind == "value":
        return ValueError("boom")
    if kind == "key":
        return KeyError("missing")
    if kind == "stolen":
        return CardStolen("card stolen")
    if kind.startswith("job:"):  # job:<type>[:<CODE>]
        parts = kind.split(":")
        code = parts[2] if len(parts) > 2 else None
        return JobError(parts[1], f"handler said {code or 'nothing'}", code=code)  # type: ignore[arg-type]
    raise AssertionError(f"unknown failure kind {kind!r}")


def perform(task: Any, step: str) -> str:
    """Carry out one script step (``retry:<countdown>`` calls ``task.retry``)."""
    if step == "ok":
        return "ok"
    if step == "reject-once":  # the handler asks Celery to requeue, on its first run only
        if len(RUNS[task.request.id]) == 1:
            raise Reject("not now", requeue=True)
        return "ok"
    if step.startswith("retry:"):
        raise task.retry(exc=ValueError("asked to retry"), countdown=float(step[6:]))
    if step.startswith("sleep:"):
        time.sleep(float(step.split(":", 1)[1]))
        return "slept"
    if step.startswith("raise:"):
        raise _failure(step.split(":", 1)[1])
    if step == "ignore":  # the handler ends the job, Celery's way: no state stored
        raise Ignore()
    if step == "reject":  # the handler drops the message
        raise Reject("not wanted", requeue=False)
    if step.startswith("replace"):  # replace:<step>|<step>...: Task.replace, same queue
        queue = (task.request.delivery_info or {}).get("routing_key")
        kind, script = step.split(":", 1)
        replacement = task.si(script.split("|")).set(queue=queue)
        if kind == "replace-chain":  # a chain: its last task takes the job's id
            replacement = chain(task.si(["ok"]).set(queue=queue), replacement)
        if kind == "replace-unsendable":  # arguments JSON cannot encode: the send fails
            replacement = task.si(object()).set(queue=queue)
        if kind == "replace-swallowed":  # the body swallows Celery's Ignore, then fails
            with suppress(Exception):
                task.replace(replacement)
            raise ValueError("after the replace")
        raise task.replace(replacement)
    if step.startswith("recurse:"):  # the task calls itself from its body, n levels deep
        depth = int(step.split(":", 1)[1])
        return str(task(["ok"] if depth <= 1 else [f"recurse:{depth - 1}"]))
    raise AssertionError(f"unknown step {step!r}")


def register_tasks(app: Celery) -> dict[str, Any]:
    """Define the test tasks on ``app``; return them by name."""

    # shared=False: a shared task would be added to every app finalized later.
    @app.task(shared=False, base=OjsTask, bind=True, name=f"{app.main}.scripted",
              retry_policy=SCRIPTED_POLICY)
    def scripted(self: Any, script: list[str]) -> str:
        attempt = _record(self)
        return perform(self, script[min(attempt, len(script)) - 1])

    @app.task(shared=False, base=OjsTask, bind=True, name=f"{app.main}.timed",
              retry_policy=TIMED_POLICY, jitter_source=random.Random(JITTER_SEED).random)
    def timed(self: Any, failures: int) -> str:
        attempt = _record(self)
        if attempt <= failures:
            raise ValueError(f"failure {attempt}")
        return "ok"

    @app.task(shared=False, base=OjsTask, bind=True, name=f"{app.main}.payment",
              retry_policy=SCRIPTED_POLICY)
    def payment(self: Any, card: str, email: str, script: list[str]) -> str:
        """Personal data in the arguments and in every error message (logs must not show it)."""
        step = script[min(_record(self), len(script)) - 1]
        detail = f"declined {card} for {email}"
        if step == "ok":
            return "ok"
        if step == "raise:value":
            raise ValueError(detail)
        if step == "raise:stolen":
            raise CardStolen(detail)
        if step == "fail":
            raise JobError("order.invalid", detail, code="FAIL")
        raise AssertionError(f"unknown step {step!r}")

    @app.task(shared=False, base=OjsTask, bind=True, name=f"{app.main}.retrying",
              retry_policy=SCRIPTED_POLICY)
    def retrying(self: Any, step: str, n: int = 0) -> str:
        return retry_steps.retrying(self, step, n)

    @app.task(shared=False, base=retry_steps.RetryingInHooks, bind=True,
              name=f"{app.main}.hooked", retry_policy=SCRIPTED_POLICY)
    def hooked(self: Any, step: str) -> str:
        return retry_steps.hooked(self, step)

    return {"scripted": scripted, "timed": timed, "payment": payment, "retrying": retrying,
            "hooked": hooked}


@dataclass
class Broker:
    """A broker (and result backend) the tests run against, with per-run isolation."""

    name: str
    url: str
    backend: str
    prefix: str = field(default_factory=lambda: f"ojs-test-{uuid.uuid4().hex[:8]}")
    created: list[str] = field(default_factory=list)

    def transport_options(self) -> dict[str, Any]:
        if self.name == "memory":
            return {"polling_interval": 0.01}
        if self.name == "redis":
            return {"global_keyprefix": self.prefix + ":", "visibility_timeout": 60}
        return {}

    def make_app(self, main: str = "ojs-tests") -> Celery:
        app = Celery(main, broker=self.url, backend=self.backend, set_as_current=False)
        app.conf.update(
            broker_transport_options=self.transport_options(),
            result_backend_transport_options={"global_keyprefix": self.prefix + ":"},
            result_expires=600,
            broker_connection_retry_on_startup=True,
            worker_hijack_root_logger=False,
            ojs_default_retry_policy=APP_DEFAULT_POLICY,
        )
        return app

    def queue_name(self, label: str = "q") -> str:
        name = f"{self.prefix}-{label}-{uuid.uuid4().hex[:6]}"
        self.created.extend([name, f"{name}.dead_letter"])
        return name

    def connection(self, app: Celery) -> Connection:
        return app.connection_for_write()

    def cleanup(self, app: Celery) -> None:
        """Delete the queues (and their exchanges) this run created, nothing else."""
        with self.connection(app) as conn:
            channel = conn.default_channel
            for name in self.created:
                for delete in (channel.queue_delete, channel.exchange_delete):
                    try:
                        delete(name)
                    except Exception:
                        channel = conn.channel()  # AMQP closes the channel on a 404
        if self.name == "redis":
            import redis

            client = redis.Redis.from_url(self.url)
            for key in client.scan_iter(match=f"{self.prefix}:*", count=500):
                client.delete(key)


def broker_named(name: str) -> Broker:
    """The test broker ``memory``, ``redis`` or ``amqp`` (records in Redis); skips if down."""
    from tests.brokers import AMQP_URL, REDIS_URL, require

    if name == "memory":
        return Broker("memory", "memory://", "cache+memory://")
    require("Redis", "127.0.0.1", 6379)
    if name == "redis":
        return Broker("redis", REDIS_URL, REDIS_URL)
    require("RabbitMQ", "127.0.0.1", 5672)
    return Broker("amqp", AMQP_URL, REDIS_URL)  # the record needs a storing backend


def drain(app: Celery, queue: str, *, timeout: float = 5.0, expect: int = 1) -> list[Any]:
    """Take up to ``expect`` messages off ``queue`` (acked), waiting at most ``timeout``."""
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    with app.connection_for_write() as conn:
        simple = conn.SimpleQueue(queue, no_ack=False)
        try:
            while len(got) < expect and time.monotonic() < deadline:
                try:
                    message = simple.get(timeout=0.2)
                except simple.Empty:
                    continue
                message.ack()
                got.append(message)
        finally:
            simple.close()
    return got


def wait_for(predicate: Any, *, timeout: float = 10.0, interval: float = 0.02) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


@contextmanager
def redis_app(redis_url: str, name: str, **conf: Any) -> Iterator[Celery]:
    """A Celery app of its own on the shared Redis (broker and backend, keys under a prefix
    of its own, removed on exit), with ``conf`` on top."""
    prefix = f"ojs-test-{name}-{uuid.uuid4().hex[:8]}"
    app = Celery(prefix, broker=redis_url, backend=redis_url, set_as_current=False)
    keys = {"global_keyprefix": prefix + ":"}
    app.conf.update(broker_transport_options=keys, result_backend_transport_options=keys,
                    task_default_queue=f"{prefix}-q", broker_connection_retry_on_startup=True,
                    worker_hijack_root_logger=False, **conf)
    try:
        yield app
    finally:
        client = app.backend.client
        for key in client.scan_iter(match=f"{prefix}:*", count=500):
            client.delete(key)


def wake_for_shutdown(task: Any, *args: Any, **options: Any) -> None:
    """Flag the in-process worker's shutdown, then send ``task`` once so its consumer loop
    sees the flag now: it only checks it when its poll times out (up to 10 s on AMQP, the
    worker's whole ``shutdown_timeout``)."""
    worker_state.should_terminate = 0
    task.apply_async(args, **options)


def stop_group(process: subprocess.Popen[Any], timeout: float = 30) -> None:
    """SIGTERM ``process``'s group (a worker started with ``start_new_session``: a warm
    shutdown), SIGKILL if it lingers past ``timeout`` seconds."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
