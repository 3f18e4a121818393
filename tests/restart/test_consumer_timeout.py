"""Issue 8: a retry waiting longer than RabbitMQ's ``consumer_timeout`` runs once, and no
channel is closed.

A private RabbitMQ node (``servers.PrivateRabbit``) with ``consumer_timeout`` 2.5 s,
checked every 250 ms (``channel_tick_interval``, as RabbitMQ's own test suites shorten
it): a delivery left unacked longer closes its channel, which the node logs as "timed
out waiting for delivery acknowledgement", and every message unacked on it comes back.
``JOBS`` jobs per framework fail attempt 1 and wait ``DELAY`` (4 s) for attempt 2:

- **parked** (``ojs_park_after`` / ``park_after`` 1 s): each retry waits in the delay
  levels and the worker holds it for under a second: the node closes no channel, and
  every attempt 2 runs exactly once, never before its delay (RET-11);
- **control** (parking off): the worker holds each retry unacked for 4 s, and the node
  closes its channel: proof that this setup catches a retry held past the timeout.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_ext.records import RecordStore
from dramatiq_ext import OjsRetries, current_job
from tests.dramatiq_ext.harness import make_env
from tests.restart.celery_app import TASK_NAME, Config, build_app
from tests.restart.servers import PrivateRabbit, rabbitmq_scripts
from tests.restart.support import DELAY, POLICY, RunLog, body, require_binary, verdict, wait_for
from tests.restart.test_celery_restart import celery_worker

pytestmark = [pytest.mark.broker, pytest.mark.slow]
#: The node's ``consumer_timeout``, ms: shorter than ``DELAY``.
CONSUMER_TIMEOUT_MS = 2500
#: What the node logs when it closes a channel for an unacked delivery.
TIMED_OUT = "timed out waiting for delivery acknowledgement"
#: Jobs per cell.
JOBS = 10


@pytest.fixture(scope="module")
def short_timeout_rabbit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateRabbit]:
    require_binary("rabbitmq-server", rabbitmq_scripts())
    server = PrivateRabbit(tmp_path_factory.mktemp("rabbit-timeout"), rabbit_env={
        "consumer_timeout": CONSUMER_TIMEOUT_MS, "channel_tick_interval": 250})
    try:
        server.start()
        yield server
    finally:
        server.close()


def timeouts(server: PrivateRabbit) -> int:
    """How many deliveries the node has timed out so far."""
    return sum(path.read_text(errors="replace").count(TIMED_OUT)
               for path in (server.folder / "log").glob("*.log"))


def run_dramatiq(server: PrivateRabbit, redis_url: str, log: RunLog, keys: list[str], *,
                 park_after: float | None, until: Any) -> None:
    ojs = OjsRetries(jitter_source=lambda: 0.5, park_after=park_after)
    with make_env("rabbitmq", redis_url=redis_url, amqp_url=server.url, ojs=ojs) as env:
        def job(key: str) -> str:
            context = current_job()
            assert context is not None
            return body(log, key, context.attempt)

        actor = env.actor(job, retry_policy=POLICY)
        env.start(threads=4)
        ids = [actor.send(key).message_id for key in keys]
        until(lambda: all((r := env.record(i)) is not None and r.state == "completed"
                          for i in ids))


def run_celery(server: PrivateRabbit, redis_url: str, log: RunLog, keys: list[str],
               folder: Path, *, park_after: float | None, until: Any) -> None:
    config = Config(broker=server.url, backend=redis_url, queue=f"ojs-ct-{uuid.uuid4().hex[:8]}",
                    runs=str(log.path), park_after=park_after)
    app = build_app(config)
    store = RecordStore(app.backend)
    with celery_worker(config, folder):
        ids = [app.tasks[TASK_NAME].apply_async((key,)).id for key in keys]
        until(lambda: all((r := store.load(i)) is not None and r.state == "completed"
                          for i in ids))


@pytest.mark.parametrize("framework", ["celery", "dramatiq"])
@pytest.mark.parametrize("parked", [True, False], ids=["parked", "control"])
def test_issue8_retry_longer_than_consumer_timeout_runs_once_and_closes_no_channel(
        framework: str, parked: bool, short_timeout_rabbit: PrivateRabbit, redis_url: str,
        tmp_path: Path) -> None:
    server = short_timeout_rabbit
    log = RunLog(tmp_path / "runs")
    keys = [f"{framework}-{i}" for i in range(JOBS)]
    before = timeouts(server)

    def until(completed: Any) -> None:
        if parked:
            wait_for(completed, timeout=DELAY + 30, what="every job completed")
            time.sleep(1.5)  # a copy handed out again would run now
        else:
            wait_for(lambda: timeouts(server) > before, timeout=DELAY + 20,
                     what="the node timed out a held retry (control)")

    run = run_celery if framework == "celery" else run_dramatiq
    extra = {"folder": tmp_path} if framework == "celery" else {}
    run(server, redis_url, log, keys, park_after=1.0 if parked else None, until=until, **extra)
    if parked:
        assert timeouts(server) == before, "a parked retry was held past consumer_timeout"
        verdict(keys, log.runs())
