"""A real Dramatiq broker and worker per test, isolated from other tests and other engineers.

Each ``Env`` owns a fresh broker (StubBroker, RedisBroker in a namespace of its own,
or RabbitmqBroker with queues of its own), a unique queue name, and an in-process
``dramatiq.Worker``. Actors are declared on that broker only. Cleanup deletes only
the keys and queues the test created.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import dramatiq
from dramatiq.brokers.stub import StubBroker
from dramatiq.message import Message
from dramatiq.middleware import (
    AgeLimit,
    Callbacks,
    Middleware,
    Pipelines,
    Retries,
    ShutdownNotifications,
    TimeLimit,
)

from dramatiq_ext import OjsRetries, get_job_record
from ojs_adapters import JobRecord

#: How often the worker polls and the time-limit thread checks, in ms: short for fast tests.
TICK_MS = 50


class SentLog(Middleware):
    """Records every ``broker.enqueue`` with the delay (ms) handed to the broker."""

    def __init__(self) -> None:
        self.sent: list[tuple[Message[Any], int | None]] = []

    def before_enqueue(self, broker: Any, message: Any, delay: Any) -> None:
        self.sent.append((message, delay))

    def retries(self, message_id: str) -> list[tuple[Message[Any], int | None]]:
        """The re-enqueues (delay set) of one message, in order."""
        return [(m, d) for m, d in self.sent if m.message_id == message_id and d is not None]


def flaky(failures: int, calls: list[float], exc: BaseException | None = None,
          result: Any = None) -> Callable[..., Any]:
    """An actor body that fails ``failures`` times, then returns ``result``; notes each start."""

    def job(*_args: Any) -> Any:
        calls.append(time.monotonic())
        if len(calls) <= failures:
            raise exc or RuntimeError(f"failure {len(calls)}")
        return result

    return job


_TIME_LIMITS: list[TimeLimit] = []  # registry: one checker thread shared by every test


def dramatiq_defaults() -> list[Middleware]:
    """Dramatiq's default middleware (``Retries`` included), with a fast time-limit check.

    The ``TimeLimit`` is shared: its checker thread keys deadlines by worker thread,
    and starting it is what ``after_process_boot`` does in a ``dramatiq`` process.
    """
    if not _TIME_LIMITS:
        time_limit = TimeLimit(interval=TICK_MS)
        time_limit.manager.start()
        _TIME_LIMITS.append(time_limit)
    return [AgeLimit(), _TIME_LIMITS[0], ShutdownNotifications(), Callbacks(), Pipelines(),
            Retries()]


@dataclass
class Env:
    """One broker, one queue, one worker; see the module docstring."""

    kind: str
    broker: Any
    queue: str
    ojs: OjsRetries
    log: SentLog
    redis: Any = None  # a redis client when the test uses Redis
    namespace: str = ""
    workers: list[dramatiq.Worker] = field(default_factory=list)
    _dead: list[Message[Any]] = field(default_factory=list)

    def actor(self, fn: Callable[..., Any], **options: Any) -> Any:
        """Declare ``fn`` as an actor on this env's broker and queue, under a unique name."""
        name = f"{fn.__name__}_{uuid.uuid4().hex[:8]}"
        return dramatiq.actor(fn, broker=self.broker, queue_name=self.queue,
                              actor_name=name, **options)

    def start(self, threads: int = 2) -> dramatiq.Worker:
        worker = dramatiq.Worker(self.broker, worker_timeout=TICK_MS, worker_threads=threads)
        worker.start()
        self.workers.append(worker)
        return worker

    def record(self, message_id: str) -> JobRecord | None:
        return get_job_record(message_id, broker=self.broker)

    def wait_record(self, message_id: str, *, done: Callable[[JobRecord], bool] | None = None,
                    timeout: float = 20.0) -> JobRecord:
        """Poll the job record until ``done`` (default: a terminal state)."""
        done = done or (lambda r: r.state in ("completed", "discarded"))
        deadline = time.monotonic() + timeout
        while True:
            record = self.record(message_id)
            if record is not None and done(record):
                return record
            if time.monotonic() > deadline:
                raise AssertionError(f"record of {message_id} never got there: {record}")
            time.sleep(0.02)

    def dead_letters(self, *, expect: int = 0, timeout: float = 10.0) -> list[Message[Any]]:
        """The messages in this queue's dead-letter queue (waits for ``expect`` of them)."""
        deadline = time.monotonic() + timeout
        while True:
            self._dead.extend(self._drain_dead())
            if len(self._dead) >= expect or time.monotonic() > deadline:
                return list(self._dead)
            time.sleep(0.05)

    def _drain_dead(self) -> list[Message[Any]]:
        if self.kind == "stub":
            found = [p._message for p in self.broker.dead_letters_by_queue[self.queue]]
            self.broker.dead_letters_by_queue[self.queue].clear()
            return found
        if self.kind == "redis":
            key = f"{self.namespace}:{self.queue}.XQ"
            ids = self.redis.zrange(key, 0, -1)
            if not ids:
                return []
            datas = self.redis.hmget(key + ".msgs", ids)
            self.redis.zrem(key, *ids)
            return [Message.decode(d) for d in datas if d is not None]
        channel = self.broker.channel
        out = []
        while True:
            method, _props, body = channel.basic_get(f"{self.queue}.XQ", auto_ack=True)
            if method is None:
                return out
            out.append(Message.decode(body))

    def close(self) -> None:
        for worker in self.workers:
            worker.stop(timeout=5000)
        if self.kind == "rabbitmq":
            channel = self.broker.channel
            for name in (self.queue, f"{self.queue}.DQ", f"{self.queue}.XQ"):
                channel.queue_delete(name)
        if self.redis is not None and self.namespace:
            keys = list(self.redis.scan_iter(match=f"{self.namespace}:*", count=500))
            if keys:
                self.redis.delete(*keys)
        self.broker.close()


def pika_url(amqp_url: str) -> str:
    """The shared AMQP URL in pika's spelling: kombu's ``//`` (vhost ``/``) is ``/%2F``."""
    return amqp_url[:-2] + "/%2F" if amqp_url.endswith("//") else amqp_url


def build_broker(kind: str, namespace: str, *, redis_url: str | None = None,
                 amqp_url: str | None = None, extra: list[Middleware] | None = None,
                 **broker_options: Any) -> tuple[Any, Any]:
    """A broker of ``kind`` with Dramatiq's defaults plus ``extra``; and a Redis client or None.

    Redis keys (broker and Results) all start with ``namespace``, so one scan removes them.
    """
    middleware = [*dramatiq_defaults(), *(extra or [])]
    if kind == "stub":
        return StubBroker(middleware=middleware, fail_fast_default=False), None
    import redis

    assert redis_url is not None
    client = redis.Redis.from_url(redis_url)
    if kind == "redis":
        from dramatiq.brokers.redis import RedisBroker

        return RedisBroker(url=redis_url, namespace=namespace, middleware=middleware,
                           **broker_options), client
    from dramatiq.brokers.rabbitmq import RabbitmqBroker
    from dramatiq.results import Results
    from dramatiq.results.backends import RedisBackend

    # Job records go through Dramatiq's Results backend (on Redis), so any process
    # (the SIGKILL test's replacement worker, the test itself) reads them.
    assert amqp_url is not None
    backend = RedisBackend(url=redis_url, namespace=namespace, use_namespace_prefix_keys=True)
    broker = RabbitmqBroker(url=pika_url(amqp_url), middleware=middleware, max_priority=10,
                            **broker_options)
    broker.add_middleware(Results(backend=backend))
    return broker, client


@contextmanager
def make_env(kind: str, *, redis_url: str | None = None, amqp_url: str | None = None,
             ojs: OjsRetries | None = None, extra: list[Middleware] | None = None,
             **broker_options: Any) -> Iterator[Env]:
    """An ``Env`` of the given kind (``stub``, ``redis`` or ``rabbitmq``), cleaned up on exit."""
    token = uuid.uuid4().hex[:10]
    namespace = f"ojs-test-{token}"
    broker, client = build_broker(kind, namespace, redis_url=redis_url, amqp_url=amqp_url,
                                  extra=extra, **broker_options)
    ojs = ojs or OjsRetries(jitter_source=lambda: 0.5)
    log = SentLog()
    broker.add_middleware(ojs)
    broker.add_middleware(log)
    env = Env(kind, broker, f"ojs_test_{token}", ojs, log, client,
              namespace if client is not None else "")
    try:
        yield env
    finally:
        env.close()


def crashed_attempt(env: Env, actor: Any) -> Message[Any]:
    """A message of ``actor`` (``max_attempts`` 1) whose attempt 1 was running when its
    worker died: its record says ``active``; enqueue it to redeliver it."""
    message: Message[Any] = actor.message()
    running = JobRecord(id=message.message_id, type=message.actor_name, queue=env.queue,
                        max_attempts=1).started(1)
    env.ojs.store_for(env.broker).save(message.message_id, running.to_dict())
    return message
