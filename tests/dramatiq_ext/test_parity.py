"""Issue 16: Dramatiq's own retry options keep their native outcome under ``OjsRetries``.

Native Dramatiq ``fail()``\\ s an exhausted message and a ``throws`` error, and the
broker puts it on ``<queue>.XQ``; an actor stating those options under ``OjsRetries``
must end there too (DESIGN.md "Native parity"), on real workers on Redis and RabbitMQ.
Where an OJS policy overrides that, it is said once, as the actor is declared.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker
from dramatiq.common import q_name

from dramatiq_ext import OjsRetries
from ojs_adapters import RetryPolicy
from ojs_adapters.migrate import from_dramatiq
from tests.dramatiq_ext.harness import (
    Env,
    SentLog,
    build_broker,
    dramatiq_defaults,
    flaky,
    make_env,
)

REAL_BROKERS = ["redis", "rabbitmq"]
#: The issue's actor: two retries, 500 ms minimum backoff (Dramatiq's own units).
NATIVE = {"max_retries": 2, "min_backoff": 500}


def _urls(request: pytest.FixtureRequest, kind: str) -> dict[str, str]:
    urls = {"redis_url": request.getfixturevalue("redis_url")}
    if kind == "rabbitmq":
        urls["amqp_url"] = request.getfixturevalue("amqp_url")
    return urls


@contextmanager
def native_env(request: pytest.FixtureRequest, kind: str) -> Iterator[Env]:
    """The control: Dramatiq's defaults with its own ``Retries``, no ``OjsRetries``."""
    token = uuid.uuid4().hex[:10]
    namespace = f"ojs-test-{token}"
    broker, client = build_broker(kind, namespace, **_urls(request, kind))  # type: ignore[arg-type]
    # ``ojs`` is not on the broker: this env is used for its actors, worker and .XQ only.
    env = Env(kind, broker, f"ojs_test_{token}", OjsRetries(), SentLog(), client, namespace)
    try:
        yield env
    finally:
        env.close()


@pytest.mark.parametrize("kind", REAL_BROKERS)
def test_native_options_dead_letter_on_xq_as_native_dramatiq_does(
        request: pytest.FixtureRequest, kind: str) -> None:
    native_calls: list[float] = []
    with native_env(request, kind) as native:
        actor = native.actor(flaky(99, native_calls), **NATIVE)
        native.start()
        message = actor.send(7)
        [dead] = native.dead_letters(expect=1, timeout=15)
        assert (dead.message_id, len(native_calls)) == (message.message_id, 3)

    calls: list[float] = []
    with make_env(kind, **_urls(request, kind)) as env:  # type: ignore[arg-type]
        actor = env.actor(flaky(99, calls), **NATIVE)
        env.start()
        message = actor.send(7)
        record = env.wait_record(message.message_id)
        assert (record.state, record.outcome, record.dead_lettered) == (
            "discarded", "dead_letter", True)
        assert len(calls) == 3
        # as `ojs-retry migrate --from dramatiq` says: 1.5 x min_backoff (Dramatiq's mean
        # jitter), doubled; the OJS jitter multiplier is pinned at 1.0
        assert record.extra["countdowns"] == from_dramatiq(NATIVE).policy.schedule() == [
            0.75, 1.5]
        [dead] = env.dead_letters(expect=1)
        assert (dead.message_id, dead.args, q_name(dead.queue_name)) == (
            message.message_id, (7,), env.queue)
        assert [e["attempt"] for e in dead.options["ojs"]["errors"]] == [1, 2, 3]


class Fatal(Exception):
    """An error an actor lists in Dramatiq's ``throws``."""


@pytest.mark.parametrize("kind", REAL_BROKERS)
def test_throws_dead_letters_at_once_as_native_dramatiq_does(
        request: pytest.FixtureRequest, kind: str) -> None:
    calls: list[float] = []
    with make_env(kind, **_urls(request, kind)) as env:  # type: ignore[arg-type]
        actor = env.actor(flaky(99, calls, Fatal("no")), throws=(Fatal,))
        env.start()
        message = actor.send()
        record = env.wait_record(message.message_id)
        assert (len(calls), record.outcome, record.dead_lettered) == (1, "dead_letter", True)
        assert record.errors[0].code == "NON_RETRYABLE_ERROR"
        [dead] = env.dead_letters(expect=1)
        assert dead.message_id == message.message_id


def _conflicts(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "natively" in r.getMessage()]


def test_an_ojs_on_exhaustion_wins_and_is_said_once_at_declaration(
        stub_env: Env, caplog: pytest.LogCaptureFixture) -> None:
    calls: list[float] = []
    with caplog.at_level(logging.WARNING, logger="dramatiq_ext"):
        actor = stub_env.actor(flaky(99, calls), max_retries=1,
                               retry_policy={"on_exhaustion": "discard", "jitter": False,
                                             "initial_interval": "PT0.02S"})
    [said] = _conflicts(caplog)
    assert actor.actor_name in said and "max_retries" in said and "'discard'" in said
    stub_env.start()
    message = actor.send()
    record = stub_env.wait_record(message.message_id)
    assert (len(calls), record.outcome, record.dead_lettered) == (2, "discarded", False)
    assert stub_env.dead_letters(timeout=0.3) == []
    assert len(_conflicts(caplog)) == 1  # at declaration only, never per message


@pytest.mark.parametrize("default", [{"on_exhaustion": "discard"},
                                     RetryPolicy.from_dict({"on_exhaustion": "discard"})],
                         ids=["mapping", "RetryPolicy"])
def test_a_default_policy_on_exhaustion_wins_over_native_parity(
        caplog: pytest.LogCaptureFixture, default: Any) -> None:
    """Given as a mapping or as a ``RetryPolicy`` (which states every field), the default
    policy's ``on_exhaustion`` is the user's word over native parity, and is said once."""
    broker = StubBroker(middleware=dramatiq_defaults())
    broker.add_middleware(OjsRetries(default_policy=default))
    with caplog.at_level(logging.WARNING, logger="dramatiq_ext"):
        plain = dramatiq.actor(lambda: None, actor_name="plain", broker=broker)
        native = dramatiq.actor(lambda: None, actor_name="native", broker=broker, throws=Fatal)
    [said] = _conflicts(caplog)
    assert "'native'" in said and "default_policy" in said
    ojs = next(m for m in broker.middleware if isinstance(m, OjsRetries))
    assert ojs.actor_policy(broker, native.actor_name).on_exhaustion == "discard"
    assert ojs.actor_policy(broker, plain.actor_name).on_exhaustion == "discard"


def test_without_native_options_the_ojs_defaults_apply(stub_env: Env) -> None:
    """Adding OjsRetries chooses the OJS policy: 3 attempts, then discard (RET-10)."""
    actor = stub_env.actor(flaky(0, []))
    policy = stub_env.ojs.actor_policy(stub_env.broker, actor.actor_name)
    assert (policy.max_attempts, policy.on_exhaustion) == (3, "discard")


def test_native_parity_holds_for_actors_declared_before_the_middleware(
        caplog: pytest.LogCaptureFixture) -> None:
    """``add_middleware`` declares existing actors to it: same policy, same single notice."""
    for default, outcome, notices in (({}, "dead_letter", 0), ({"on_exhaustion": "discard"},
                                                                "discard", 1)):
        broker = StubBroker(middleware=dramatiq_defaults())
        early = dramatiq.actor(lambda: None, actor_name="early", broker=broker, max_retries=3)
        dramatiq.actor(lambda: None, actor_name="plain", broker=broker)
        ojs = OjsRetries(default_policy=default)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="dramatiq_ext"):
            broker.add_middleware(ojs)
        assert [("'early'" in m) for m in _conflicts(caplog)] == [True] * notices
        policy = ojs.actor_policy(broker, early.actor_name)
        assert (policy.max_attempts, policy.on_exhaustion) == (4, outcome)


#: Native retry options without ``max_retries``: Dramatiq's own 20 retries apply natively.
NO_COUNT = {"min_backoff": 1, "max_backoff": 5, "throws": (Fatal,)}


@pytest.mark.parametrize("kind", REAL_BROKERS)
def test_native_options_without_max_retries_keep_dramatiqs_20_retries(
        request: pytest.FixtureRequest, kind: str) -> None:
    """DESIGN.md "Native parity": an actor naming only ``min_backoff``, ``max_backoff`` or
    ``throws`` is retried Dramatiq's default 20 times (21 attempts), then lands on .XQ, as
    native Dramatiq and ``ojs-retry migrate --from dramatiq`` say; not 3 attempts."""
    native_calls: list[float] = []
    with native_env(request, kind) as native:
        actor = native.actor(flaky(99, native_calls), **NO_COUNT)
        native.start()
        actor.send()
        native.dead_letters(expect=1, timeout=20)
    calls: list[float] = []
    with make_env(kind, **_urls(request, kind)) as env:  # type: ignore[arg-type]
        actor = env.actor(flaky(99, calls), **NO_COUNT)
        env.start()
        message = actor.send()
        record = env.wait_record(message.message_id, timeout=30)
        [dead] = env.dead_letters(expect=1)
    assert len(native_calls) == 21
    assert (len(calls), record.max_attempts, record.outcome, dead.message_id) == (
        21, 21, "dead_letter", message.message_id)


def test_an_ojs_max_attempts_wins_over_dramatiqs_default_count(stub_env: Env) -> None:
    """The native count applies only where no OJS policy states one (RET-10 merge)."""
    own = stub_env.actor(flaky(0, []), min_backoff=10, retry_policy={"max_attempts": 4})
    native = stub_env.actor(flaky(0, []), min_backoff=10)
    plain = stub_env.actor(flaky(0, []))
    attempts = [stub_env.ojs.actor_policy(stub_env.broker, a.actor_name).max_attempts
                for a in (own, native, plain)]
    assert attempts == [4, 21, 3]
    broker = StubBroker(middleware=dramatiq_defaults())
    ojs = OjsRetries(default_policy={"max_attempts": 5})
    broker.add_middleware(ojs)
    stated = dramatiq.actor(lambda: None, actor_name="stated", broker=broker, throws=Fatal)
    assert ojs.actor_policy(broker, stated.actor_name).max_attempts == 5
