"""Celery, native and OJS, on one broker with one in-process worker.

One app, one queue, one worker (``celery.contrib.testing.worker.start_worker``,
thread pool) serve both variants, so they share every condition; a round runs
one variant's batch at a time. Per retry delay ``d`` the app has two tasks
around the same body (``workload.Journal.attempt``):

- native: ``autoretry_for=(PlannedFailure,)``, ``max_retries=2``,
  ``default_retry_delay=d``, no backoff, no jitter; ``acks_late`` as OjsTask
  has it; ``on_failure`` publishes the job to ``<queue>.dead_letter``, the few
  lines a native user writes for a dead letter (Celery has none on Redis).
- OJS: ``OjsTask`` with ``max_attempts`` 3, ``initial_interval`` d,
  ``backoff_strategy`` none, jitter off, ``on_exhaustion`` dead_letter.

Results and OJS job records go to Redis on both brokers.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Any

import redis
from celery import Celery, Task
from celery.contrib.testing.worker import start_worker
from kombu.entity import Queue

from bench import env
from bench.workload import (
    ALL_DELAYS,
    MAX_ATTEMPTS,
    WAKE_KEY,
    Journal,
    PlannedFailure,
    Variant,
)
from celery_ext import OjsTask
from ojs_adapters.durations import format_duration

#: Worker threads (the same for every framework).
CONCURRENCY = 4


class NativeTask(Task):  # type: ignore[misc]  # celery ships no type hints
    """Celery's own retries, plus a dead letter on the final failure."""

    abstract = True
    acks_late = True
    #: Where ``on_failure`` sends exhausted jobs; set per app.
    dead_letter_queue = ""

    def on_failure(self, exc: BaseException, task_id: str, args: Any, kwargs: Any,
                   einfo: Any) -> None:
        queue = Queue(self.dead_letter_queue, routing_key=self.dead_letter_queue,  # type: ignore[no-untyped-call]
                      durable=True)
        with self.app.producer_or_acquire() as producer:
            producer.publish({"id": task_id, "args": list(args), "error": repr(exc)},
                             exchange="", routing_key=self.dead_letter_queue,
                             serializer="json", declare=[queue], retry=True)


def ojs_policy(delay: float) -> dict[str, Any]:
    """The OJS policy equal to the native settings for retry delay ``delay``."""
    return {"max_attempts": MAX_ATTEMPTS, "initial_interval": format_duration(
        timedelta(seconds=delay)), "backoff_strategy": "none", "jitter": False,
        "on_exhaustion": "dead_letter"}


class CelerySide:
    """Both variants on ``broker`` (``redis`` or ``rabbitmq``); see the module docstring."""

    framework = "celery"

    def __init__(self, broker: str, *, variants: tuple[Variant, ...] = ("native", "ojs"),
                 concurrency: int = CONCURRENCY) -> None:
        self.broker = broker
        self.journal = Journal()
        self.prefix = env.namespace(f"celery-{broker}")
        self.queue = f"{self.prefix}-q"
        self.dead_letter_queue = f"{self.queue}.dead_letter"
        url = env.REDIS_URL if broker == "redis" else env.AMQP_URL
        app = Celery(self.prefix, broker=url, backend=env.REDIS_URL, set_as_current=False)
        redis_keys = {"global_keyprefix": self.prefix + ":"}
        app.conf.update(
            broker_transport_options=redis_keys if broker == "redis" else {},
            result_backend_transport_options=redis_keys,
            result_expires=600, task_default_queue=self.queue,
            broker_connection_retry_on_startup=True, worker_hijack_root_logger=False,
        )
        self.app = app
        self.tasks: dict[tuple[Variant, float], Any] = {}
        body = self.journal.body()
        for delay in ALL_DELAYS:
            if "native" in variants:
                self.tasks["native", delay] = app.task(
                    body, name=f"bench.native.{delay}", base=NativeTask, shared=False,
                    autoretry_for=(PlannedFailure,), max_retries=MAX_ATTEMPTS - 1,
                    default_retry_delay=delay, retry_backoff=False, retry_jitter=False,
                    dead_letter_queue=self.dead_letter_queue)
            if "ojs" in variants:
                self.tasks["ojs", delay] = app.task(
                    body, name=f"bench.ojs.{delay}", base=OjsTask, shared=False,
                    retry_policy=ojs_policy(delay))
        self.concurrency = concurrency
        self._redis = redis.Redis.from_url(env.REDIS_URL)
        self._declare(self.dead_letter_queue)
        self._worker: AbstractContextManager[Any] | None = None

    def send(self, variant: Variant, delay: float, key: str, fail_times: int) -> None:
        self.tasks[variant, delay].apply_async((key, fail_times), queue=self.queue)

    def start(self, variants: tuple[Variant, ...]) -> None:
        """Start the worker (one serves both variants)."""
        if self._worker is None:
            self._worker = start_worker(
                self.app, pool="threads", concurrency=self.concurrency,
                perform_ping_check=False, queues=[self.queue], loglevel="CRITICAL",
                shutdown_timeout=10)
            self._worker.__enter__()

    def stop(self) -> None:
        """Stop the worker (Celery has no pause); unstarted jobs stay queued."""
        if self._worker is not None:
            _wake_for_shutdown(self)
            self._worker.__exit__(None, None, None)
            self._worker = None

    def dead_letters(self, variant: Variant) -> int:
        if self.broker == "redis":
            return int(self._redis.llen(f"{self.prefix}:{self.dead_letter_queue}"))
        with self.app.connection_for_write() as conn:
            ok = conn.default_channel.queue_declare(queue=self.dead_letter_queue, passive=True)
            return int(ok.message_count)

    def purge_dead_letters(self, variant: Variant) -> None:
        if self.broker == "redis":
            self._redis.delete(f"{self.prefix}:{self.dead_letter_queue}")
            return
        with self.app.connection_for_write() as conn:
            conn.default_channel.queue_purge(self.dead_letter_queue)

    def close(self) -> None:
        try:
            self.stop()
        finally:
            if self.broker == "rabbitmq":
                env.delete_rabbitmq_queues([self.queue, self.dead_letter_queue])
            env.delete_redis_keys(self.prefix)
            self._redis.close()

    def _declare(self, name: str) -> None:
        with self.app.connection_for_write() as conn:
            queue = Queue(name, routing_key=name, durable=True)  # type: ignore[no-untyped-call]
            queue(conn.default_channel).declare()  # type: ignore[no-untyped-call]


def _wake_for_shutdown(side: CelerySide) -> None:
    """Flag the shutdown and send one message, so the consumer loop sees the flag at once."""
    from celery.worker import state as worker_state

    worker_state.should_terminate = 0
    task = next(iter(side.tasks.values()))
    task.apply_async((WAKE_KEY, 0), queue=side.queue)
