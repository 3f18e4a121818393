"""The Celery app and task of the Celery driver, built alike in the driver and its worker.

The driver's process (which sends the jobs and reads the records) and the
prefork worker subprocess (``_celery_worker``) build their app here from one
``AppConfig``, so they agree on broker, result backend, key prefix, queue and
the task's name and options.

Result backend (where the job records live): ``cache+memory://`` with the
``memory://`` broker; the broker's own Redis with ``redis://``; and with
``amqp://``, the Redis at ``OJS_RECORD_REDIS_URL`` (default
``redis://127.0.0.1:6379/0``), because RabbitMQ stores nothing a second process
can read by task id. Every Redis key of a run (broker and backend) starts with
the run's ``prefix``, so ``stop()`` removes exactly what the run created.

>>> config = AppConfig("memory://", "cache+memory://", "ojs-conformance-x", "q-x")
>>> AppConfig.from_json(config.to_json()) == config
True
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from typing import Any

from celery import Celery, current_task

from celery_ext import OjsTask
from conformance.script import run_script, scripted_jitter

#: Name of the conformance task in every process.
TASK_NAME = "ojs_conformance.job"
#: Name of the no-op task that wakes an in-process worker's consumer loop at shutdown.
WAKE_TASK_NAME = "ojs_conformance.wake"
#: Hard time limit of the conformance task in seconds; a ``timeout`` step sleeps far longer.
TIME_LIMIT_SECONDS = 1.0
#: Where ``amqp://`` runs keep their job records (the same setting as the Dramatiq driver's).
RECORD_REDIS_URL = os.environ.get("OJS_RECORD_REDIS_URL", "redis://127.0.0.1:6379/0")
#: How often the in-process ``memory://`` consumer polls its queues, in seconds.
MEMORY_POLLING_INTERVAL = 0.01


@dataclass(frozen=True)
class AppConfig:
    """Everything a process needs to build the run's Celery app."""

    broker_url: str
    backend_url: str
    prefix: str
    queue: str

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> AppConfig:
        return cls(**json.loads(text))


def job_jitter() -> float:
    """The app's ``ojs_jitter_source``: the running job's scenario sample (else 0.5).

    Read from the request's keyword arguments, so it names the right job even
    when the adapter decides on a redelivered attempt before the script ran.
    """
    task = current_task
    kwargs = getattr(getattr(task, "request", None), "kwargs", None) or {}
    if "jitter_sample" not in kwargs:
        return scripted_jitter()
    sample = kwargs["jitter_sample"]
    return 0.5 if sample is None else float(sample)


def build_app(config: AppConfig) -> Celery:
    """The run's app with the conformance task (and the wake task) registered."""
    app = Celery("ojs_conformance", broker=config.broker_url, backend=config.backend_url,
                 set_as_current=False)
    redis_prefix = {"global_keyprefix": config.prefix + ":"}
    if config.broker_url.startswith("memory"):
        transport_options: dict[str, Any] = {"polling_interval": MEMORY_POLLING_INTERVAL}
    elif config.broker_url.startswith(("redis", "rediss")):
        transport_options = redis_prefix
    else:
        transport_options = {}
    app.conf.update(
        broker_transport_options=transport_options,
        result_backend_transport_options=redis_prefix,
        result_expires=600,
        broker_connection_retry_on_startup=True,
        task_default_queue=config.queue,
        worker_prefetch_multiplier=1,
        worker_enable_remote_control=False,
        worker_hijack_root_logger=False,
        ojs_jitter_source=job_jitter,
    )

    app.task(shared=False, base=OjsTask, name=TASK_NAME,
             time_limit=TIME_LIMIT_SECONDS)(conformance_job)
    app.task(shared=False, name=WAKE_TASK_NAME)(wake)
    return app


def conformance_job(job_key: str, script: list[dict[str, Any]], log_folder: str,
                    jitter_sample: float | None = None) -> str:
    """The body of the conformance task: the scenario's script for this attempt."""
    return run_script(job_key, script, log_folder, jitter_sample)


def wake() -> None:
    """Nothing: its message only makes an embedded consumer look at the shutdown flag."""
