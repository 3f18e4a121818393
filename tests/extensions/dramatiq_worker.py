"""A Dramatiq worker process of the extension tests: ``python -m`` this module, until SIGTERM."""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker

from dramatiq_ext import OjsRetries, current_job
from ojs_adapters.runtime.budget import RetryBudgets
from tests.extensions.jobs import BUDGET_MINIMUM, BUDGET_SHARE, POLICIES, Config, Runs, body


def build_broker(config: Config) -> tuple[Any, dict[str, Any]]:
    """A Redis broker with ``OjsRetries`` (shared budgets) and one actor per job."""
    budgets = RetryBudgets(redis.Redis.from_url(config.redis_url), share=BUDGET_SHARE,
                           minimum=BUDGET_MINIMUM)
    broker = RedisBroker(url=config.redis_url, namespace=config.ns)
    broker.add_middleware(OjsRetries(retry_budgets=budgets))
    runs = Runs(config)
    actors = {}
    for job, policy in POLICIES.items():
        options: dict[str, Any] = {"retry_policy": policy}
        if job == "limited":
            options["retry_budget"] = config.dependency

        def run(n: int, job: str = job) -> str:
            return body(job, n, current_job(), runs)

        actors[job] = dramatiq.actor(run, broker=broker, actor_name=f"{config.ns}_{job}",
                                     queue_name=config.queue, **options)
    return broker, actors


def main(name: str) -> None:
    config = Config.from_env()
    assert config is not None, "OJS_EXTENSION_TESTS is not set"
    broker, _ = build_broker(config)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    worker = dramatiq.Worker(broker, queues={config.queue}, worker_threads=2,
                             worker_timeout=50)
    worker.start()
    Runs(config).ready(name)
    try:
        while not stop.wait(0.2):
            pass
    finally:
        worker.stop(timeout=3000)
        broker.close()


if __name__ == "__main__":
    main(sys.argv[1])
