"""A dead-letter queue name shared by several queues (no ``{queue}`` in it), on a real
worker: memory://, Redis and RabbitMQ. In a module of its own: one in-process Celery worker
at a time (``test_celery_dlq`` keeps one for its whole module)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from celery.contrib.testing.worker import start_worker

from celery_ext import OjsTask
from celery_ext._console import CeleryConsole
from celery_ext.dlq import dead_letter_queue
from ojs_adapters import JobError
from ojs_adapters.runtime.dlq import DeadLetterFilter
from tests.celery_ext.support import broker_named, wake_for_shutdown
from tests.dlq.scenario import wait_for

POLICY: dict[str, Any] = {"max_attempts": 1, "on_exhaustion": "dead_letter"}


@pytest.mark.broker
@pytest.mark.parametrize("name", ["memory", "redis", "amqp"])
def test_one_dead_letter_queue_for_every_queue_keeps_each_letter_s_own_queue(name: str) -> None:
    """``ojs_dead_letter_queue`` without ``{queue}`` gathers every queue's dead letters in
    one: each is listed under, replayed to and purged with the queue it came from."""
    broker = broker_named(name)
    app = broker.make_app(f"ojs-dlq-shared-{name}")
    first, second = broker.queue_name("a"), broker.queue_name("b")
    app.conf.task_default_queue = first
    app.conf.ojs_dead_letter_queue = shared = broker.queue_name("all") + ".dead"
    broker.created.append(shared)
    healed, ran = threading.Event(), []

    def job(task: Any, n: int) -> None:
        if not healed.is_set():
            raise JobError("net.Timeout", f"job {n}")
        ran.append((n, task.request.delivery_info.get("routing_key")))

    task = app.task(job, shared=False, base=OjsTask, bind=True, retry_policy=POLICY,
                    name=f"{app.main}.job")
    try:
        with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False,
                          queues=[first, second], loglevel="CRITICAL", shutdown_timeout=30):
            for n, queue in ((1, first), (2, first), (3, second)):
                task.apply_async((n,), queue=queue)
            dlq = dead_letter_queue(app, queues=[first, second])
            try:
                wait_for(lambda: dlq.list().total == 3, "three dead letters in one queue")
                assert dlq.list(DeadLetterFilter(queue=first)).total == 2
                assert dlq.list(DeadLetterFilter(queue=second)).total == 1
                console = CeleryConsole(dlq)  # its broker-side reads, too
                assert console.depths() == {first: 2, second: 1}
                [theirs] = console.letters(DeadLetterFilter(queue=second)).items
                assert console.letter(theirs.id, second, theirs.key) is not None
                healed.set()
                assert len(dlq.replay(DeadLetterFilter(queue=first)).replayed) == 2
                wait_for(lambda: len(ran) == 2, "the two replayed jobs to run")
                assert sorted(ran) == [(1, first), (2, first)]
                assert dlq.purge(DeadLetterFilter(queue=first)) == 0  # not the other's
                assert dlq.list().total == 1
                assert dlq.purge(DeadLetterFilter(queue=second)) == 1
                assert dlq.list().total == 0
            finally:
                dlq.close()
            wake_for_shutdown(task, 0, queue=first)
    finally:
        broker.cleanup(app)
