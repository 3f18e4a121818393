"""Dramatiq's ``Results`` under ``OjsRetries``: a job the policy ends stores its failure.

Natively a message failed for good has its exception stored (``Results.after_nack``):
``get_result`` raises ``ResultFailure`` carrying the exception's class name and text.
A job ``OjsRetries`` discards (a non-retryable error, attempts exhausted) or dead-letters
stores the same, promptly, on real workers on Redis and RabbitMQ with a Redis backend.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from dramatiq.results import ResultFailure, Results
from dramatiq.results.backends import RedisBackend

from tests.dramatiq_ext.harness import Env, crashed_attempt, flaky, make_env

FAST = {"initial_interval": "PT0.02S", "jitter": False}


class Fatal(Exception):
    """An error an actor lists in Dramatiq's ``throws``."""


@pytest.fixture(params=["redis", "rabbitmq"])
def results_env(request: pytest.FixtureRequest) -> Iterator[tuple[Env, Any]]:
    """A real broker with ``Results`` on a Redis backend (the RabbitMQ env has one)."""
    urls = {"redis_url": request.getfixturevalue("redis_url")}
    extra = []
    if request.param == "rabbitmq":
        urls["amqp_url"] = request.getfixturevalue("amqp_url")
    else:
        namespace = f"ojs-test-{uuid.uuid4().hex[:10]}-results"
        extra.append(Results(backend=RedisBackend(url=urls["redis_url"], namespace=namespace)))
    with make_env(request.param, extra=extra, **urls) as env:  # type: ignore[arg-type]
        results = next(m for m in env.broker.middleware if isinstance(m, Results))
        yield env, results.backend
        if extra:
            keys = list(env.redis.scan_iter(match=f"{namespace}*", count=500))
            if keys:
                env.redis.delete(*keys)


def _failure(env: Env, backend: Any, message: Any) -> ResultFailure:
    started = time.monotonic()
    with pytest.raises(ResultFailure) as failed:
        message.get_result(backend=backend, block=True, timeout=4000)
    assert time.monotonic() - started < 3.5  # stored as the job ended, not a timeout
    return failed.value


@pytest.mark.parametrize(("options", "error"), [
    ({"retry_policy": {**FAST, "non_retryable_errors": ["ValueError"]}}, ValueError("bad")),
    ({"retry_policy": {**FAST, "max_attempts": 2}}, KeyError("gone")),
], ids=["non_retryable", "exhausted"])
def test_a_discarded_job_stores_its_error_as_native_failure_does(
        results_env: tuple[Env, Any], options: dict[str, Any], error: Exception) -> None:
    env, backend = results_env
    actor = env.actor(flaky(99, [], error), store_results=True, **options)
    env.start()
    message = actor.send()
    failure = _failure(env, backend, message)
    assert (failure.orig_exc_type, failure.orig_exc_msg) == (type(error).__name__, str(error))
    record = env.wait_record(message.message_id)
    assert (record.state, record.dead_lettered) == ("discarded", False)


def test_a_dead_lettered_job_stores_its_error_as_native_failure_does(
        results_env: tuple[Env, Any]) -> None:
    env, backend = results_env
    actor = env.actor(flaky(99, [], Fatal("card stolen")), store_results=True,
                      throws=(Fatal,))
    env.start()
    message = actor.send()
    failure = _failure(env, backend, message)
    assert (failure.orig_exc_type, failure.orig_exc_msg) == ("Fatal", "card stolen")
    assert str(failure) == "actor raised Fatal: card stolen"
    [dead] = env.dead_letters(expect=1)
    assert dead.message_id == message.message_id


def test_a_job_ended_with_its_worker_stores_the_ojs_error_type(
        results_env: tuple[Env, Any]) -> None:
    """RET-12: no exception was raised (the worker died), so the name is the OJS type."""
    env, backend = results_env
    actor = env.actor(flaky(0, []), store_results=True, retry_policy={"max_attempts": 1})
    message = crashed_attempt(env, actor)
    env.start()
    env.broker.enqueue(message)
    failure = _failure(env, backend, message)
    assert failure.orig_exc_type == "ojs.worker_lost"
    assert env.wait_record(message.message_id).outcome == "discarded"
