"""On a RedisBroker holding the records, no record write of a job has a round trip of its
own: admission's script, the retry's enqueue (``_redis_retry``), the dead letter in place,
and the final record in the ack's transaction (``_ack_ride``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dramatiq_ext import _ack_ride
from dramatiq_ext._store_redis import _RedisScripts
from tests.dramatiq_ext.conftest import open_env
from tests.dramatiq_ext.harness import Env


@pytest.fixture
def redis_env(request: pytest.FixtureRequest) -> Iterator[Env]:
    yield from open_env(request, "redis")


def _saves_alone(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    alone: list[str] = []
    real = _RedisScripts.save

    def counted(self: Any, key: str, *args: Any) -> None:
        alone.append(key)
        real(self, key, *args)

    monkeypatch.setattr(_RedisScripts, "save", counted)
    return alone


@pytest.mark.broker
def test_a_job_s_records_ride_on_redis(redis_env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    alone = _saves_alone(monkeypatch)
    calls: dict[str, int] = {}

    def flaky(key: str, fail: int) -> None:
        calls[key] = calls.get(key, 0) + 1
        if calls[key] <= fail:
            raise ValueError("boom")

    actor = redis_env.actor(flaky, retry_policy={"max_attempts": 3,
                                                 "initial_interval": "PT0.01S"})
    redis_env.start()
    done, retried = actor.send("done", 0), actor.send("retried", 1)
    for message in (done, retried):
        record = redis_env.wait_record(message.message_id)
        assert record.state == "completed"
    assert redis_env.wait_record(retried.message_id).attempt == 2
    assert alone == [], "a record was saved in a round trip of its own"
    assert not any(_ack_ride.STASH in vars(m) for m in (done, retried))


@pytest.mark.broker
def test_a_record_redis_refuses_in_the_ack_s_transaction_is_saved_after_it(
        redis_env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ack goes; the save that failed inside its MULTI is done alone after it."""
    monkeypatch.setattr(_ack_ride, "ORDERED_SAVE_LUA",
                        "if true then return redis.error_reply('refused') end\n"
                        + _ack_ride.ORDERED_SAVE_LUA)
    alone = _saves_alone(monkeypatch)
    rode: list[str] = []
    real = _ack_ride._Dispatch._with_save

    def counted(self: Any, ride: Any, keys: Any, argv: Any) -> Any:
        rode.append(ride.command)
        return real(self, ride, keys, argv)

    monkeypatch.setattr(_ack_ride._Dispatch, "_with_save", counted)
    actor = redis_env.actor(lambda: None, retry_policy={"max_attempts": 1})
    redis_env.start()
    message = actor.send()
    assert redis_env.wait_record(message.message_id).state == "completed"
    assert rode == ["ack"] and len(alone) == 1
