"""Fixtures: one real in-process Celery worker per broker (memory://, Redis, RabbitMQ).

Starting and stopping an embedded worker costs seconds, so each broker gets
one worker for the session, consuming a pool of fresh queues; every test
takes queues of its own from the pool (``env.take_queue()``), so no test sees
another's messages or dead letters.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker

from tests.celery_ext.support import Broker, broker_named, register_tasks, wake_for_shutdown

#: Queues each session worker consumes; tests take them one by one.
QUEUES_PER_WORKER = 72


@dataclass
class Env:
    """A running worker on one broker, its app, tasks and unused queues."""

    broker: Broker
    app: Celery
    tasks: dict[str, Any]
    free: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.broker.name

    def take_queue(self) -> str:
        assert self.free, "raise QUEUES_PER_WORKER"
        return self.free.pop()


@pytest.fixture(scope="package", params=["memory", "redis", "amqp"])
def env(request: pytest.FixtureRequest) -> Iterator[Env]:
    """A worker on the broker named by the parameter, shared by this package's tests.

    Package scope, not session: the last one would otherwise outlive this package
    and run beside other modules' in-process workers, which share Celery's global
    worker state (``should_terminate``) and kombu's event loop; one stopping could
    stop the other.
    """
    broker = broker_named(request.param)
    app = broker.make_app(f"ojs-tests-{broker.name}")
    tasks = register_tasks(app)
    queues = [broker.queue_name(f"s{i}") for i in range(QUEUES_PER_WORKER)]
    with start_worker(app, pool="threads", concurrency=4, perform_ping_check=False,
                      queues=queues, loglevel="WARNING", shutdown_timeout=30):
        yield Env(broker, app, tasks, list(queues))
        _wake_for_shutdown(tasks["scripted"], queues[0])
    broker.cleanup(app)


def _wake_for_shutdown(task: Any, queue: str) -> None:
    """The message goes unprocessed with the queue in cleanup (``support.wake_for_shutdown``)."""
    wake_for_shutdown(task, ["ok"], queue=queue)
