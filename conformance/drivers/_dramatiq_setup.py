"""The broker, middleware and actor of the Dramatiq driver, built alike in every process.

The driver's own process and each crash-worker process (``_dramatiq_worker``)
build their broker here from one ``BrokerConfig``, so they agree on what a
message and a job record depend on: broker URL, Redis namespace, record store,
middleware and the actor's name, queue and options.

Job records: ``StubBroker`` keeps them in process memory (enough, it has no
other process); ``RedisBroker`` in its own Redis under ``<namespace>:ojs-record``;
``RabbitmqBroker`` has no store a second process can read, so its records go to
the Redis at ``OJS_RECORD_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``),
under the run's namespace. Crash detection (RET-12) needs that shared store.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal

import dramatiq
from dramatiq.broker import Broker
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import (
    AgeLimit,
    Callbacks,
    Middleware,
    Pipelines,
    ShutdownNotifications,
    TimeLimit,
)

from conformance.drivers import UrlKind, url_kind
from conformance.script import run_script, scripted_jitter
from dramatiq_ext import OjsRetries, RecordStore, RedisRecordStore

#: How often workers poll and the time-limit thread checks, in milliseconds.
TICK_MS = 50
#: The conformance actor's time limit in ms; a ``timeout`` step sleeps far longer.
TIME_LIMIT_MS = 1000
#: Redis heartbeat timeout of crash workers in ms: how soon a killed worker's message returns.
CRASH_HEARTBEAT_MS = 1000
#: Where RabbitMQ runs keep their job records (RabbitMQ has no store of its own).
RECORD_REDIS_URL = os.environ.get("OJS_RECORD_REDIS_URL", "redis://127.0.0.1:6379/0")

#: A broker kind the driver knows.
Kind = Literal["stub", "redis", "rabbitmq"]
#: The driver's name for each kind the shared URL reader (``url_kind``) gives.
_KINDS: dict[UrlKind, Kind] = {"memory": "stub", "redis": "redis", "amqp": "rabbitmq"}

#: Registry of the one ``TimeLimit`` per process: its checker thread runs until exit.
TIME_LIMIT_REGISTRY: list[TimeLimit] = []


def broker_kind(url: str) -> Kind:
    """Which broker a ``--ojs-broker`` URL names; ``ValueError`` for an unknown scheme."""
    kind = url_kind(url)
    if kind is None:
        raise ValueError(f"the Dramatiq driver takes memory, redis://... or amqp://..., "
                         f"not {url!r}")
    return _KINDS[kind]


def pika_url(url: str) -> str:
    """``url`` in pika's spelling: kombu's trailing ``//`` (vhost ``/``) is ``/%2F``."""
    return url[:-2] + "/%2F" if url.endswith("//") else url


@dataclass(frozen=True)
class BrokerConfig:
    """Everything a process needs to build the run's broker."""

    kind: Kind
    url: str
    namespace: str

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> BrokerConfig:
        return cls(**json.loads(text))


def shared_time_limit() -> TimeLimit:
    """This process's ``TimeLimit``, its checker thread started (a ``dramatiq`` CLI does that)."""
    if not TIME_LIMIT_REGISTRY:
        time_limit = TimeLimit(time_limit=TIME_LIMIT_MS, interval=TICK_MS)
        time_limit.manager.start()
        TIME_LIMIT_REGISTRY.append(time_limit)
    return TIME_LIMIT_REGISTRY[0]


def build_broker(config: BrokerConfig, *, crash_worker: bool = False) -> Broker:
    """Dramatiq's default middleware with ``OjsRetries`` in ``Retries``' place.

    ``crash_worker`` gives a Redis broker a short heartbeat timeout and queue
    maintenance on every command, so a killed worker's message is requeued
    within about ``CRASH_HEARTBEAT_MS``.
    """
    store: RecordStore | None = None
    if config.kind == "rabbitmq":
        store = RedisRecordStore(url=RECORD_REDIS_URL, prefix=f"{config.namespace}:ojs-record")
    middleware: list[Middleware] = [
        AgeLimit(), shared_time_limit(), ShutdownNotifications(), Callbacks(), Pipelines(),
        OjsRetries(jitter_source=scripted_jitter, store=store),
    ]
    if config.kind == "stub":
        return StubBroker(middleware=middleware)
    if config.kind == "redis":
        from dramatiq.brokers.redis import RedisBroker

        options: dict[str, Any] = {}
        if crash_worker:
            options = {"heartbeat_timeout": CRASH_HEARTBEAT_MS, "maintenance_chance": 1_000_000}
        redis_broker: Callable[..., Broker] = RedisBroker  # its __init__ is unannotated
        return redis_broker(url=config.url, namespace=config.namespace, middleware=middleware,
                            **options)
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    return RabbitmqBroker(url=pika_url(config.url), middleware=middleware)


def conformance_job(job_key: str, script: list[dict[str, Any]], log_folder: str,
                    jitter_sample: float | None = None) -> str:
    """The body of the conformance actor: the scenario's script for this attempt."""
    return run_script(job_key, script, log_folder, jitter_sample)


def declare_actor(broker: Broker, *, actor_name: str, queue_name: str) -> dramatiq.Actor[Any, Any]:
    """Declare the conformance actor on ``broker`` (same name and queue in every process)."""
    declare = dramatiq.actor(broker=broker, actor_name=actor_name, queue_name=queue_name,
                             time_limit=TIME_LIMIT_MS)
    actor: dramatiq.Actor[Any, Any] = declare(conformance_job)
    return actor
