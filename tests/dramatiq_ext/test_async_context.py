"""Issue 16: ``current_job()`` inside an ``async def`` actor (Dramatiq's ``AsyncIO`` middleware).

The coroutine runs on the middleware's event-loop thread, not the worker thread
that ``OjsRetries`` set the context on; a real worker on Redis proves it sees it.
"""

from __future__ import annotations

import asyncio

from dramatiq.middleware.asyncio import AsyncIO

from dramatiq_ext import KEY_OPTION, current_job
from tests.dramatiq_ext.harness import make_env


def test_async_actor_reads_its_attempt_and_idempotency_key(redis_url: str) -> None:
    seen: list[tuple[int, str, int]] = []

    async def charge(order_id: int) -> None:
        await asyncio.sleep(0)  # read after a suspension too, not only at first step
        job = current_job()
        assert job is not None, "current_job() is None inside an async actor"
        seen.append((job.attempt, job.idempotency_key, len(job.errors)))
        if job.attempt == 1:
            raise RuntimeError("declined once")

    with make_env("redis", redis_url=redis_url, extra=[AsyncIO()]) as env:
        actor = env.actor(charge, retry_policy={"initial_interval": "PT0.05S",
                                                "jitter": False})
        env.start()
        message = actor.send(7)
        key = message.options[KEY_OPTION]
        record = env.wait_record(message.message_id)
    assert (record.state, record.attempt) == ("completed", 2)
    assert seen == [(1, key, 0), (2, key, 1)]


def test_context_is_cleared_outside_an_attempt() -> None:
    assert current_job() is None


