"""Dramatiq, native and OJS, on one broker kind, each with its own in-process worker.

``OjsRetries`` takes the place of ``Retries`` on a broker, so the variants need
two brokers (same kind, separate namespaces and queues); a batch starts a
``dramatiq.Worker`` (same size for both) on its variant's broker only. Both
brokers have Dramatiq's default middleware (the ``TimeLimit`` checker runs, as
in a ``dramatiq`` process). Per retry delay ``d``:

- native: ``Retries`` with ``max_retries=2``, ``min_backoff = max_backoff = d``.
  Dramatiq always jitters its backoff (to 50-100 % of ``max_backoff`` here), so
  the benchmark calls ``compute_backoff`` with ``jitter=False`` for ``Retries``:
  fixed delays, as on the OJS side.
- OJS: ``OjsRetries``, ``max_attempts`` 3, ``initial_interval`` d,
  ``backoff_strategy`` none, jitter off, ``on_exhaustion`` dead_letter. Job
  records go to the broker's Redis (RedisBroker) or to a ``RedisRecordStore``
  (RabbitMQ: the store the adapter's docs recommend there).
- results (the ``reference`` section only): native, plus Dramatiq's ``Results``
  middleware storing every job's result in Redis (``store_results=True``): what a
  Dramatiq app that keeps results pays, as every Celery app with a result backend does.

Exhausted jobs end in ``<queue>.XQ`` on both sides.
"""

from __future__ import annotations

import functools
from typing import Any

import dramatiq
from dramatiq.common import compute_backoff
from dramatiq.middleware import (
    AgeLimit,
    Callbacks,
    Middleware,
    Pipelines,
    Retries,
    ShutdownNotifications,
    TimeLimit,
)
from dramatiq.middleware import retries as retries_module
from dramatiq.results import Results
from dramatiq.results.backends.redis import RedisBackend

from bench import env
from bench.celery_side import CONCURRENCY, ojs_policy
from bench.workload import ALL_DELAYS, MAX_ATTEMPTS, Journal, Variant
from dramatiq_ext import OjsRetries, RedisRecordStore

#: How long an idle worker waits between polls, ms (Dramatiq's default is 1000).
WORKER_TIMEOUT = 100


#: Registry of the one ``TimeLimit`` whose checker thread every broker here shares.
_TIME_LIMITS: list[TimeLimit] = []


def _defaults() -> list[Middleware]:
    """Dramatiq's default middleware without ``Retries``, the time-limit checker running."""
    if not _TIME_LIMITS:
        time_limit = TimeLimit(interval=WORKER_TIMEOUT)
        time_limit.manager.start()  # what after_process_boot does in a dramatiq process
        _TIME_LIMITS.append(time_limit)
    return [AgeLimit(), _TIME_LIMITS[0], ShutdownNotifications(), Callbacks(), Pipelines()]


class DramatiqSide:
    """Both variants on ``broker`` (``redis`` or ``rabbitmq``); see the module docstring."""

    framework = "dramatiq"

    def __init__(self, broker: str, *, variants: tuple[Variant, ...] = ("native", "ojs"),
                 threads: int = CONCURRENCY, worker_timeout: int = WORKER_TIMEOUT) -> None:
        retries_module.compute_backoff = functools.partial(  # type: ignore[attr-defined]
            compute_backoff, jitter=False)
        self.broker = broker
        self.journal = Journal()
        self.prefix = env.namespace(f"dramatiq-{broker}")
        self.brokers: dict[Variant, Any] = {}
        self.queues: dict[Variant, str] = {}
        self.workers: dict[Variant, dramatiq.Worker] = {}
        self.threads, self.worker_timeout = threads, worker_timeout
        attempt = self.journal.body()

        def body(key: str, fail_times: int) -> None:
            # None, as an actor without a results backend returns: a value would make
            # Dramatiq log a warning per job, on both sides, and pad the figures.
            attempt(key, fail_times)

        body.__name__ = attempt.__name__
        for variant in variants:
            space = f"{self.prefix}-{variant}"
            queue = self.queues[variant] = space.replace("-", "_")
            native = variant != "ojs"
            extra: list[Middleware] = [Retries(max_retries=MAX_ATTEMPTS - 1)] if native else []
            if variant == "results":
                extra.append(Results(backend=RedisBackend(  # type: ignore[no-untyped-call]
                    url=env.REDIS_URL, namespace=f"{space}-results")))
            the_broker = self.brokers[variant] = self._broker(space, _defaults() + extra)
            if not native:
                store = None if broker == "redis" else RedisRecordStore(
                    url=env.REDIS_URL, prefix=f"{space}:ojs-record")
                the_broker.add_middleware(OjsRetries(store=store))
            for delay in ALL_DELAYS:
                millis = round(delay * 1000)
                options: dict[str, Any] = (
                    {"max_retries": MAX_ATTEMPTS - 1, "min_backoff": millis,
                     "max_backoff": millis} if native else {"retry_policy": ojs_policy(delay)})
                if variant == "results":
                    options["store_results"] = True
                dramatiq.actor(broker=the_broker, queue_name=queue,
                               actor_name=f"bench_{variant}_{millis}", **options)(body)

    def _broker(self, space: str, middleware: list[Middleware]) -> Any:
        if self.broker == "redis":
            from dramatiq.brokers.redis import RedisBroker

            return RedisBroker(  # type: ignore[no-untyped-call]
                url=env.REDIS_URL, namespace=space, middleware=middleware)
        from dramatiq.brokers.rabbitmq import RabbitmqBroker

        return RabbitmqBroker(url=env.pika_url(), middleware=middleware)

    def send(self, variant: Variant, delay: float, key: str, fail_times: int) -> None:
        actor = self.brokers[variant].get_actor(f"bench_{variant}_{round(delay * 1000)}")
        actor.send(key, fail_times)

    def start(self, variants: tuple[Variant, ...]) -> None:
        """Start a fresh worker per variant (``Worker.pause`` takes seconds on Redis)."""
        for variant in variants:
            if variant not in self.workers:
                worker = self.workers[variant] = dramatiq.Worker(
                    self.brokers[variant], worker_threads=self.threads,
                    worker_timeout=self.worker_timeout)
                worker.start()

    def stop(self) -> None:
        while self.workers:
            self.workers.popitem()[1].stop(timeout=10_000)

    def dead_letters(self, variant: Variant) -> int:
        broker, queue = self.brokers[variant], self.queues[variant]
        if self.broker == "redis":
            return int(broker.client.zcard(f"{broker.namespace}:{queue}.XQ"))
        ok = broker.channel.queue_declare(f"{queue}.XQ", passive=True)
        return int(ok.method.message_count)

    def purge_dead_letters(self, variant: Variant) -> None:
        broker, queue = self.brokers[variant], self.queues[variant]
        if self.broker == "redis":
            broker.client.delete(f"{broker.namespace}:{queue}.XQ",
                                 f"{broker.namespace}:{queue}.XQ.msgs")
        else:
            broker.channel.queue_purge(f"{queue}.XQ")

    def close(self) -> None:
        try:
            self.stop()
            for broker in self.brokers.values():
                broker.close()
        finally:
            if self.broker == "rabbitmq":
                env.delete_rabbitmq_queues(
                    f"{q}{suffix}" for q in self.queues.values() for suffix in ("", ".DQ", ".XQ"))
            env.delete_redis_keys(self.prefix)
            retries_module.compute_backoff = compute_backoff  # type: ignore[attr-defined]
