"""A ``dramatiq`` worker process for the SIGKILL tests.

``python -m tests.dramatiq_ext.crash_worker '<json config>'`` builds the same broker
as the test (``harness.build_broker``, same Redis namespace / RabbitMQ queue),
declares the test's actor under the same name with a body that touches the
``signal`` file and then blocks, and runs a real ``dramatiq.Worker`` until killed.
"""

from __future__ import annotations

import json
import pathlib
import sys
import time

import dramatiq

from dramatiq_ext import OjsRetries
from tests.dramatiq_ext.harness import TICK_MS, build_broker


def main(config: dict[str, str]) -> None:
    broker, _client = build_broker(config["kind"], config["namespace"],
                                   redis_url=config.get("redis_url"),
                                   amqp_url=config.get("amqp_url"))
    broker.add_middleware(OjsRetries())

    def hang(*_args: object) -> None:
        pathlib.Path(config["signal"]).write_text("started")
        while True:  # until SIGKILL
            time.sleep(0.05)

    dramatiq.actor(hang, broker=broker, queue_name=config["queue"],
                   actor_name=config["actor"], retry_policy=json.loads(config["policy"]))
    worker = dramatiq.Worker(broker, worker_timeout=TICK_MS, worker_threads=1)
    worker.start()
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
