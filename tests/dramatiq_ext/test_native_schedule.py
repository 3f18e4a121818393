"""What an actor gets under ``OjsRetries`` for the Dramatiq retry options it leaves out.

DESIGN.md "Native parity": an actor stating Dramatiq retry options keeps Dramatiq's
outcome, schedule included, for what it leaves out: the replaced ``Retries``' settings
(Dramatiq's stock ones, or those a user gave it), translated exactly as
``ojs-retry migrate --from dramatiq`` does. A customised ``Retries`` is the native
outcome of every actor, as it was before ``OjsRetries`` replaced it. A ``raise Retry``
that an actor's ``throws`` covers is not retried, as natively. Real workers on Redis and
RabbitMQ; the notices on a ``StubBroker``.
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
from dramatiq.errors import Retry
from dramatiq.middleware import Retries

from dramatiq_ext import OjsRetries
from ojs_adapters import RetryPolicy
from ojs_adapters.migrate import from_dramatiq
from tests.dramatiq_ext.harness import Env, SentLog, build_broker, flaky, make_env

REAL_BROKERS = ["redis", "rabbitmq"]


class Fatal(Exception):
    """An error an actor lists in Dramatiq's ``throws``."""


def _urls(request: pytest.FixtureRequest, kind: str) -> dict[str, str]:
    urls = {"redis_url": request.getfixturevalue("redis_url")}
    if kind == "rabbitmq":
        urls["amqp_url"] = request.getfixturevalue("amqp_url")
    return urls


def _migrated(options: dict[str, Any]) -> RetryPolicy:
    """What ``ojs-retry migrate --from dramatiq`` says for ``options`` (the reference)."""
    policy = from_dramatiq(options, version=dramatiq.__version__).policy
    assert policy is not None
    return policy


@contextmanager
def env_with(request: pytest.FixtureRequest, kind: str, retries: Retries | None = None,
             ojs: OjsRetries | None = None) -> Iterator[Env]:
    """An env whose broker had ``retries`` in Dramatiq's ``Retries`` slot (None: native only:
    the env's ``OjsRetries`` is not added, Dramatiq's own ``Retries()`` runs)."""
    token = uuid.uuid4().hex[:10]
    broker, client = build_broker(kind, f"ojs-test-{token}", **_urls(request, kind))  # type: ignore[arg-type]
    ojs = ojs or OjsRetries(jitter_source=lambda: 0.5)  # jitter multiplier 1.0
    if retries is not None:
        index = next(i for i, m in enumerate(broker.middleware) if isinstance(m, Retries))
        broker.middleware[index] = retries
        broker.add_middleware(ojs)
    env = Env(kind, broker, f"ojs_test_{token}", ojs, SentLog(), client, f"ojs-test-{token}")
    try:
        yield env
    finally:
        env.close()


def _first_countdown(env: Env, actor: Any) -> tuple[float, int]:
    message = actor.send()
    record = env.wait_record(message.message_id, done=lambda r: bool(r.extra.get("countdowns")))
    return record.extra["countdowns"][0], record.max_attempts


@pytest.mark.parametrize("kind", REAL_BROKERS)
def test_native_options_keep_dramatiqs_default_schedule_as_migrate_says(
        request: pytest.FixtureRequest, kind: str) -> None:
    """``throws=`` alone or ``max_retries=`` alone: Dramatiq's 15 s ``min_backoff`` (1.5 x
    for its [1, 2) jitter, as the migration says), not the OJS 1 s; no options: OJS (RET-10)."""
    with make_env(kind, **_urls(request, kind)) as env:  # type: ignore[arg-type]
        throws = env.actor(flaky(99, [], ValueError("x")), throws=(Fatal,))
        count = env.actor(flaky(99, []), max_retries=3)
        plain = env.actor(flaky(99, []))
        env.start()
        got = [_first_countdown(env, a) for a in (throws, count, plain)]
    by_throws = _migrated({"throws": [f"{__name__}.Fatal"]})
    by_count = _migrated({"max_retries": 3})
    assert got == [(by_throws.schedule()[0], 21), (by_count.schedule()[0], 4),
                   (RetryPolicy().schedule()[0], 3)]
    assert got[0][0] == got[1][0] == 22.5


#: The customised broker-level ``Retries`` of issue "broker settings are native defaults".
BROKER = {"max_retries": 2, "min_backoff": 100, "max_backoff": 1000}


@pytest.mark.parametrize("kind", REAL_BROKERS)
def test_a_customised_retries_gives_every_actor_its_native_defaults(
        request: pytest.FixtureRequest, kind: str) -> None:
    """``Retries(max_retries=2, min_backoff=100, max_backoff=1000)`` on the broker: an actor
    with no options, with ``throws`` or with ``min_backoff`` runs 3 times on that schedule
    (as migrate translates it) and lands on .XQ, as natively; an OJS field still wins."""
    with env_with(request, kind, Retries(**BROKER)) as env:
        plain = env.actor(flaky(99, []))
        throws = env.actor(flaky(99, []), throws=(Fatal,))
        slower = env.actor(flaky(99, []), min_backoff=200)
        own = env.actor(flaky(99, []), retry_policy={"max_attempts": 2})
        env.start()
        sent = [a.send() for a in (plain, throws, slower, own)]
        records = [env.wait_record(m.message_id) for m in sent]
        dead = env.dead_letters(expect=4)
    expected = [_migrated(BROKER).schedule(), _migrated(BROKER).schedule(),
                _migrated({**BROKER, "min_backoff": 200}).schedule(),
                _migrated(BROKER).schedule()[:1]]
    assert [r.extra["countdowns"] for r in records] == expected
    assert expected[0] == [0.15, 0.3]
    assert [(r.max_attempts, r.outcome) for r in records] == [(3, "dead_letter")] * 3 + [
        (2, "dead_letter")]
    assert sorted(d.message_id for d in dead) == sorted(m.message_id for m in sent)


def test_a_default_policy_field_wins_over_a_customised_retries() -> None:
    """The user's ``default_policy`` is their word over the broker-level settings."""
    broker = StubBroker(middleware=[Retries(**BROKER)])
    ojs = OjsRetries(default_policy={"max_attempts": 5, "on_exhaustion": "discard"})
    broker.add_middleware(ojs)
    plain = dramatiq.actor(lambda: None, actor_name="plain", broker=broker)
    counted = dramatiq.actor(lambda: None, actor_name="counted", broker=broker, max_retries=1)
    policies = [ojs.actor_policy(broker, a.actor_name) for a in (plain, counted)]
    assert [(p.max_attempts, p.on_exhaustion, p.schedule()[0]) for p in policies] == [
        (5, "discard", 0.15), (2, "discard", 0.15)]


@pytest.mark.parametrize(("retries", "level", "words"), [
    (Retries(), logging.DEBUG, ["Dramatiq's defaults"]),
    (Retries(max_retries=5, min_backoff=1000), logging.INFO,
     ["max_retries=5", "min_backoff=1000", "native defaults", "migrate --from dramatiq"]),
    (Retries(retry_when=lambda n, e: n < 2), logging.WARNING,
     ["retry_when", "JobError(..., code='DISCARD')", "non_retryable_errors",
      "default_policy={'max_attempts': N}"]),
], ids=["stock", "customised", "retry_when"])
def test_replacing_retries_says_what_carries_over_once(
        caplog: pytest.LogCaptureFixture, retries: Retries, level: int,
        words: list[str]) -> None:
    """Settings carry over (INFO); a ``retry_when`` cannot, so a WARNING names the fix."""
    broker: Any = StubBroker(middleware=[retries])
    broker.add_middleware(OjsRetries())
    with caplog.at_level(logging.DEBUG, logger="dramatiq_ext"):
        dramatiq.actor(lambda: None, actor_name="a", broker=broker)
        dramatiq.actor(lambda: None, actor_name="b", broker=broker)
    [said] = [r for r in caplog.records if "replaced" in r.getMessage()]
    assert said.levelno == level
    assert all(word in said.getMessage() for word in words), said.getMessage()


def _retrying(calls: list[int]) -> Any:
    def retry_always() -> None:
        calls.append(1)
        raise Retry(delay=10)

    return retry_always


@pytest.mark.parametrize("kind", REAL_BROKERS)
def test_a_retry_that_throws_covers_is_not_retried_as_natively(
        request: pytest.FixtureRequest, kind: str) -> None:
    """Natively, ``raise Retry(...)`` in an actor with ``throws=(Exception,)`` is ``fail()``\\ ed
    to .XQ at once (Retry is an Exception); under ``OjsRetries`` too."""
    native_calls: list[int] = []
    with env_with(request, kind) as native:  # Dramatiq's own Retries, the control
        actor = native.actor(_retrying(native_calls), throws=(Exception,))
        native.start()
        actor.send()
        native.dead_letters(expect=1, timeout=15)
    calls: list[int] = []
    with make_env(kind, **_urls(request, kind)) as env:  # type: ignore[arg-type]
        actor = env.actor(_retrying(calls), throws=(Exception,))
        env.start()
        message = actor.send()
        record = env.wait_record(message.message_id)
        [dead] = env.dead_letters(expect=1)
    assert len(native_calls) == 1
    assert (len(calls), record.outcome, dead.message_id) == (1, "dead_letter", message.message_id)
    assert [(e.type, e.code) for e in record.errors] == [
        ("dramatiq.errors.Retry", "NON_RETRYABLE_ERROR")]
