"""A Dramatiq worker process for one crash scenario's queue; a ``crash`` step SIGKILLs it.

``python -m conformance.drivers._dramatiq_worker '<json>'`` builds the run's broker
(``_dramatiq_setup.build_broker``, short Redis heartbeat), declares the conformance
actor on the scenario's queue and runs a one-thread ``dramatiq.Worker`` on that
queue only, until SIGTERM (a clean stop) or SIGKILL (the scenario's crash, after
which the driver starts a replacement that receives the lost message again).
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from typing import Any

import dramatiq

from conformance.drivers._dramatiq_setup import TICK_MS, BrokerConfig, build_broker, declare_actor


def main(config: dict[str, Any]) -> None:
    """Run the worker described by ``config`` (keys ``broker``, ``actor``, ``queue``)."""
    broker = build_broker(BrokerConfig.from_json(config["broker"]), crash_worker=True)
    declare_actor(broker, actor_name=config["actor"], queue_name=config["queue"])
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    worker = dramatiq.Worker(broker, queues={config["queue"]}, worker_timeout=TICK_MS,
                             worker_threads=1)
    worker.start()
    try:
        while not stop.wait(0.2):
            pass
    finally:
        worker.stop(timeout=3000)
        broker.close()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
