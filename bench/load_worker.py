"""The worker side of a load run (``bench.load``): the same job on Celery and Dramatiq.

``celery_app`` and ``dramatiq_broker`` build the app or broker of one run (its own
key prefix or namespace and queue) with the ``JOB_NAME`` task or actor under
``POLICY``; ``serve`` runs a worker on it until SIGTERM, in the process
``bench.load`` starts (``python -m bench.load --serve ...``).
"""

from __future__ import annotations

import signal
import threading
from typing import Any

import redis

#: Policy of the load job: three attempts, tiny fixed intervals, dead letter at the end.
POLICY = {"max_attempts": 3, "initial_interval": "PT0.01S", "backoff_coefficient": 1.0,
          "max_interval": "PT0.05S", "jitter": False, "on_exhaustion": "dead_letter"}
#: Name of the load task / actor.
JOB_NAME = "ojs_load_job"


class LoadFailure(Exception):
    """What a failing load job raises."""


def job_body(client: Any, counter: str, kind: str, attempt: int) -> str:
    """The body of every load job: count the run in ``counter``, then fail as ``kind`` says."""
    client.incr(counter)
    if kind == "dead" or (kind == "flaky" and attempt == 1):
        raise LoadFailure(f"{kind} job, attempt {attempt}")
    return "ok"


def celery_app(prefix: str, redis_url: str) -> Any:
    """The Celery app (and its ``JOB_NAME`` task) of a load run under key prefix ``prefix``."""
    from celery import Celery

    from celery_ext import OjsTask
    from celery_ext._headers import HeaderState

    app = Celery("ojs_load", broker=redis_url, backend=redis_url, set_as_current=False)
    app.conf.update(
        broker_transport_options={"global_keyprefix": prefix + ":", "visibility_timeout": 600},
        result_backend_transport_options={"global_keyprefix": prefix + ":"},
        result_expires=3600, worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True, worker_prefetch_multiplier=4,
    )
    client = redis.Redis.from_url(redis_url)

    @app.task(shared=False, base=OjsTask, bind=True, name=JOB_NAME,  # type: ignore[untyped-decorator]
              retry_policy=POLICY)
    def job(self: Any, kind: str) -> str:
        attempt = HeaderState.from_headers(self.request.headers).attempt
        return job_body(client, f"{prefix}:runs", kind, attempt)

    return app


def dramatiq_broker(prefix: str, queue: str, redis_url: str) -> tuple[Any, Any]:
    """The RedisBroker (namespace ``prefix``) and the ``JOB_NAME`` actor of a load run."""
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker
    from dramatiq.middleware import (
        AgeLimit,
        Callbacks,
        CurrentMessage,
        Pipelines,
        ShutdownNotifications,
    )

    from dramatiq_ext import OjsRetries
    from dramatiq_ext._state import MessageState

    broker = RedisBroker(url=redis_url, namespace=prefix, middleware=[  # type: ignore[no-untyped-call]
        AgeLimit(), ShutdownNotifications(), Callbacks(), Pipelines(), CurrentMessage(),
        OjsRetries()])
    client = redis.Redis.from_url(redis_url)

    def job(kind: str) -> str:
        message = CurrentMessage.get_current_message()
        attempt = MessageState.of(message.options).attempt if message else 1
        return job_body(client, f"{prefix}:runs", kind, attempt)

    actor = dramatiq.actor(broker=broker, queue_name=queue, actor_name=JOB_NAME,
                           retry_policy=POLICY)(job)
    return broker, actor


def serve(framework: str, prefix: str, queue: str, redis_url: str, threads: int) -> None:
    """Run a worker until SIGTERM (the worker process of ``bench.load.run``)."""
    if framework == "celery":
        app = celery_app(prefix, redis_url)
        app.worker_main(["worker", "-P", "threads", "-c", str(threads), "-Q", queue,
                         "--loglevel", "ERROR", "--without-gossip", "--without-mingle",
                         "--without-heartbeat"])
        return
    import dramatiq

    broker, _actor = dramatiq_broker(prefix, queue, redis_url)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    worker = dramatiq.Worker(broker, worker_threads=threads, worker_timeout=100)
    worker.start()
    stop.wait()
    worker.stop(timeout=10_000)
    broker.close()
