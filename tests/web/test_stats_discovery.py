"""Dramatiq on RabbitMQ with job records in a ``RedisRecordStore``: the console reads the
workers' statistics from that Redis without ``--stats`` (the broker is not Redis and there
is no Results backend to find it by)."""

from __future__ import annotations

import uuid
from typing import cast

import pytest
from starlette.testclient import TestClient

from dramatiq_ext import OjsRetries, RedisRecordStore
from dramatiq_ext._console import DramatiqConsole
from dramatiq_ext.dlq import dead_letter_queue
from ojs_adapters import JobError
from ojs_adapters.runtime.browse import ConsoleBackend
from ojs_adapters.runtime.stats import disable_stats, enable_stats
from ojs_adapters.web import ConsoleSettings, create_app
from tests.dramatiq_ext.harness import make_env
from tests.web.support import wait_for


@pytest.mark.broker
def test_stats_come_from_the_redis_record_stores_redis(redis_url: str, amqp_url: str) -> None:
    import redis

    prefix = f"ojs-test-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(redis_url)
    store = RedisRecordStore(client=client, prefix=f"{prefix}:record")
    with make_env("rabbitmq", redis_url=redis_url, amqp_url=amqp_url,
                  ojs=OjsRetries(store=store)) as env:
        env.broker.middleware[:] = [m for m in env.broker.middleware  # no Results to find
                                    if type(m).__name__ != "Results"]
        enable_stats(client=client, prefix=f"{prefix}-stats", interval=0.2)
        try:
            def fail() -> None:
                raise JobError("net.Timeout", "no route")

            actor = env.actor(fail, retry_policy={"max_attempts": 1,
                                                  "on_exhaustion": "dead_letter"})
            message = actor.send()
            env.start(threads=1)
            wait_for(lambda: getattr(env.record(message.message_id), "dead_lettered", False),
                     "the job to be dead-lettered")
            wait_for(lambda: any(client.scan_iter(match=f"{prefix}-stats*")),
                     "the statistics to be flushed")
            settings = ConsoleSettings(framework="dramatiq", stats_prefix=f"{prefix}-stats")
            app = create_app(settings, opener=lambda: cast(ConsoleBackend, DramatiqConsole(
                dead_letter_queue(env.broker, queues=[env.queue]))))
            overview = TestClient(app).get("/").text
            assert "No statistics" not in overview
            assert actor.actor_name in overview and "net.Timeout" in overview
        finally:
            disable_stats()
            for key in client.scan_iter(match=f"{prefix}*", count=500):
                client.delete(key)


def test_web_help_says_where_stats_are_looked_for_without_the_option() -> None:
    from click.testing import CliRunner

    from ojs_adapters.cli import main

    result = CliRunner().invoke(main, ["web", "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "RedisRecordStore" in said and "--option records=URL" in said
