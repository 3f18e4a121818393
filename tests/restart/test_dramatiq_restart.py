"""Issue 8, Dramatiq: the broker restarts while every job waits for its retry; all complete.

An in-process ``dramatiq.Worker`` (``OjsRetries`` in Dramatiq's default middleware,
``tests.dramatiq_ext.harness``) consumes a queue on a private broker; ``JOBS``
messages fail attempt 1 and wait ``DELAY`` s for attempt 2. Once every job record
says its retry is on the broker (``handed_off``), the broker restarts:

- Redis (AOF, ``appendfsync always``): the retries sit in the worker's delay queue
  (in memory), their ids in the worker's ack set of ``<queue>.DQ``; the consumer
  sees a connection error and starts again.
- RabbitMQ: the whole node stops and boots again; the unacked ``.DQ`` deliveries go
  back to their durable queue and are delivered again once the worker reconnects.

Each cell runs twice: with the retries in the worker's delay queue as above, and
parked on the broker (``park_after=1``: the Redis parked set with AOF, the RabbitMQ
quorum delay levels; ``dramatiq_ext._parking``).

Then each job must run attempt 2 exactly once and not before its delay (RET-11).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from dramatiq.middleware import CurrentMessage

from dramatiq_ext import OjsRetries
from dramatiq_ext._state import MessageState
from tests.dramatiq_ext.harness import make_env
from tests.restart.servers import PrivateRabbit, PrivateRedis
from tests.restart.support import (
    DELAY,
    JOBS,
    POLICY,
    RunLog,
    assert_in_backoff,
    body,
    verdict,
    wait_for,
)

#: Seconds the private Redis stays down: longer than redis-py's own quick retries.
REDIS_DOWN = 2.0
pytestmark = [pytest.mark.broker, pytest.mark.slow]


@pytest.mark.parametrize("where", ["worker", "parked"])
@pytest.mark.parametrize("kind", ["redis", "rabbitmq"])
def test_issue8_dramatiq_jobs_waiting_for_retry_survive_a_broker_restart(
        kind: str, where: str, request: pytest.FixtureRequest, private_redis: PrivateRedis,
        tmp_path: Path) -> None:
    """``where`` the retries wait: in the worker's delay queue, or parked on the broker
    (``park_after=1``: the Redis parked set, the RabbitMQ delay levels)."""
    server: PrivateRedis | PrivateRabbit = (
        private_redis if kind == "redis" else request.getfixturevalue("private_rabbit"))
    urls = {"redis_url": private_redis.url}  # the broker, or the Results store of records
    if kind == "rabbitmq":
        urls["amqp_url"] = server.url
    log = RunLog(tmp_path / "runs")
    keys = [f"job-{i}" for i in range(JOBS)]
    ojs = OjsRetries(jitter_source=lambda: 0.5, park_after=1.0 if where == "parked" else None)
    with make_env(kind, extra=[CurrentMessage()], ojs=ojs, **urls) as env:
        def job(key: str) -> str:
            message = CurrentMessage.get_current_message()
            assert message is not None
            return body(log, key, MessageState.of(message.options).attempt)

        actor = env.actor(job, retry_policy=POLICY)
        env.start(threads=4)
        started = time.monotonic()
        ids = [actor.send(key).message_id for key in keys]

        def records() -> list[Any]:
            return [env.record(message_id) for message_id in ids]

        def all_waiting() -> list[Any] | None:
            found = records()
            return found if all(r is not None and r.state == "retryable"
                                and r.extra.get("handed_off") for r in found) else None

        assert_in_backoff(wait_for(all_waiting, timeout=DELAY + 20,
                                   what="every job waits for a retry"))
        def held() -> int:
            return sum(c.delay_queue.qsize() for c in env.workers[0].consumers.values())

        if where == "worker":  # a retry just handed off may still be on its way to the
            # worker's delay queue (the .DQ consumer fetches in its own thread): wait for it
            wait_for(lambda: held() == JOBS, timeout=DELAY / 2,
                     what=f"all {JOBS} retries held in the worker (held: {held()})")
        assert held() == (0 if where == "parked" else JOBS)  # where the retries wait
        server.restart(down_for=REDIS_DOWN if kind == "redis" else 0.0)
        if kind == "rabbitmq":
            del env.broker.connection  # this thread's link died with the node: a fresh one
        survived = records()
        assert all(r is not None for r in survived), "records lost"

        def all_completed() -> bool:
            return all(r is not None and r.state == "completed" for r in records())

        wait_for(all_completed, timeout=60, what="every job completed after the restart")
        time.sleep(1.0)  # a duplicate delivery, were there one, would run now
        elapsed = time.monotonic() - started
    runs = log.runs()
    print(f"\ndramatiq {kind} ({where}): {len(runs)} runs of {JOBS} jobs, {elapsed:.1f}s")
    verdict(keys, runs)
