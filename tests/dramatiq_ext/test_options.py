"""RET-16 validation at declare and send time, and Dramatiq's own retry options (StubBroker)."""

from __future__ import annotations

from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker

from dramatiq_ext import InvalidRetryPolicy, OjsRetries
from ojs_adapters import OjsValidationError, RetryPolicy
from tests.dramatiq_ext.harness import Env, flaky


def noop(*_args: Any) -> None:
    """An actor body that does nothing."""


def test_ret16_bad_actor_policy_is_refused_at_declare_time(stub_env: Env) -> None:
    with pytest.raises(OjsValidationError) as caught:
        stub_env.actor(noop, retry_policy={"max_attempts": -1})
    assert caught.value.code == "INVALID_RETRY_POLICY"
    assert caught.value.details["field"] == "max_attempts"
    assert not any(name.startswith("noop") for name in stub_env.broker.actors)


def test_ret16_bad_message_policy_is_refused_at_send_time(stub_env: Env) -> None:
    actor = stub_env.actor(noop)
    with pytest.raises(OjsValidationError) as caught:
        actor.send_with_options(retry_policy={"initial_interval": "1 second"})
    assert caught.value.details["field"] == "initial_interval"
    assert stub_env.broker.queues[stub_env.queue].qsize() == 0  # nothing was enqueued


def test_ret16_bad_default_policy_is_refused_at_construction() -> None:
    with pytest.raises(OjsValidationError):
        OjsRetries(default_policy={"backoff_coefficient": 0.5})


def test_ret10_policy_object_on_a_message_travels_as_json(stub_env: Env) -> None:
    actor = stub_env.actor(noop)
    message = actor.send_with_options(retry_policy=RetryPolicy.from_dict({"max_attempts": 7}))
    assert message.options["retry_policy"]["max_attempts"] == 7


def test_retry_policy_is_a_declared_actor_option() -> None:
    broker = StubBroker()
    assert "retry_policy" not in broker.actor_options
    broker.add_middleware(OjsRetries())
    assert {"retry_policy", "max_retries", "throws"} <= broker.actor_options


def test_dramatiq_max_retries_and_backoff_translate_to_the_policy(stub_env: Env) -> None:
    calls: list[float] = []
    actor = stub_env.actor(flaky(99, calls), max_retries=2, min_backoff=20, max_backoff=50,
                           retry_policy={"jitter": False})
    policy = stub_env.ojs.actor_policy(stub_env.broker, actor.actor_name)
    # as `ojs-retry migrate --from dramatiq` says: 1.5 x min_backoff (Dramatiq's mean), capped
    assert (policy.max_attempts, policy.schedule()) == (3, [0.03, 0.05])
    assert policy.on_exhaustion == "dead_letter"  # native parity: Dramatiq fail()s to .XQ
    stub_env.start()
    message = actor.send()
    record = stub_env.wait_record(message.message_id)
    assert len(calls) == 3
    assert record.extra["countdowns"] == [0.03, 0.05]
    assert (record.outcome, record.dead_lettered) == ("dead_letter", True)
    [dead] = stub_env.dead_letters(expect=1)
    assert dead.message_id == message.message_id


def test_dramatiq_throws_becomes_non_retryable(stub_env: Env) -> None:
    calls: list[float] = []
    actor = stub_env.actor(flaky(99, calls, KeyError("gone")), throws=(LookupError,),
                           retry_policy={"non_retryable_errors": ["auth.*"]})
    policy = stub_env.ojs.actor_policy(stub_env.broker, actor.actor_name)
    assert policy.non_retryable_errors == ("auth.*", "LookupError")
    assert policy.on_exhaustion == "dead_letter"  # Dramatiq fail()s a throws error to .XQ
    stub_env.start()
    message = actor.send()
    record = stub_env.wait_record(message.message_id)
    assert len(calls) == 1
    assert record.errors[0].code == "NON_RETRYABLE_ERROR"
    assert (record.outcome, record.dead_lettered) == ("dead_letter", True)
    [dead] = stub_env.dead_letters(expect=1)
    assert dead.message_id == message.message_id


@pytest.mark.parametrize(("options", "field"), [
    ({"retry_when": lambda n, e: True}, "retry_when"),
    ({"on_retry_exhausted": "other"}, "on_retry_exhausted"),
    ({"max_retries": 2, "retry_policy": {"max_attempts": 4}}, "max_retries"),
    ({"max_retries": -1}, "max_retries"),
    ({"min_backoff": 0}, "min_backoff"),
    ({"throws": "ValueError"}, "throws"),
])
def test_dramatiq_options_without_ojs_meaning_are_refused(
        stub_env: Env, options: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidRetryPolicy) as caught:
        stub_env.actor(noop, **options)
    assert caught.value.details["field"] == field


def test_dramatiq_retry_options_on_a_message_are_refused(stub_env: Env) -> None:
    actor = stub_env.actor(noop)
    with pytest.raises(InvalidRetryPolicy, match="retry_policy"):
        actor.send_with_options(max_retries=3)


def test_invalid_policy_is_an_ojs_validation_error_that_dramatiq_lets_through() -> None:
    """Broker.emit_before swallows hook exceptions unless they are MiddlewareErrors."""
    from dramatiq.middleware import MiddlewareError

    assert issubclass(InvalidRetryPolicy, OjsValidationError)
    assert issubclass(InvalidRetryPolicy, MiddlewareError)


def test_dramatiq_retry_delay_is_a_floor_on_the_policy_delay(stub_env: Env) -> None:
    calls: list[float] = []
    asks = flaky(1, calls, dramatiq.Retry("later", delay=120))
    actor = stub_env.actor(asks, retry_policy={"initial_interval": "PT0.01S", "jitter": False})
    stub_env.start()
    message = actor.send()
    record = stub_env.wait_record(message.message_id)
    assert record.extra["delays_ms"] == [120]
    assert calls[1] - calls[0] >= 0.12


@pytest.mark.parametrize(("options", "field"), [
    ({"park_after": "soon"}, "park_after"), ({"park_after": -1}, "park_after"),
    ({"park_prefix": ""}, "park_prefix")])
def test_bad_parking_options_are_refused_at_construction(options: dict[str, Any],
                                                         field: str) -> None:
    with pytest.raises(OjsValidationError) as refused:
        OjsRetries(**options)
    assert (refused.value.code, refused.value.details["field"]) == ("INVALID_ARGS", field)
