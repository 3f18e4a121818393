"""Fixtures: ``env`` runs a test once per broker (StubBroker, Redis, RabbitMQ)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.dramatiq_ext.harness import Env, make_env

BROKERS = ["stub", "redis", "rabbitmq"]


def open_env(request: pytest.FixtureRequest, kind: str, **options: object) -> Iterator[Env]:
    """An ``Env`` for ``kind``, skipping (or failing on CI) when its broker is down."""
    urls: dict[str, str] = {}
    if kind in ("redis", "rabbitmq"):
        urls["redis_url"] = request.getfixturevalue("redis_url")
    if kind == "rabbitmq":
        urls["amqp_url"] = request.getfixturevalue("amqp_url")
    with make_env(kind, **urls, **options) as env:  # type: ignore[arg-type]
        yield env


@pytest.fixture(params=BROKERS)
def env(request: pytest.FixtureRequest) -> Iterator[Env]:
    """A fresh broker, queue and (not yet started) worker, for each of the three brokers."""
    yield from open_env(request, request.param)


@pytest.fixture
def stub_env(request: pytest.FixtureRequest) -> Iterator[Env]:
    """A fresh StubBroker env, for fast tests of logic that does not depend on the broker."""
    yield from open_env(request, "stub")
