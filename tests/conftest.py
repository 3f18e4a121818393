"""Shared fixtures: real broker URLs that skip (or fail on CI) when a broker is down."""

from __future__ import annotations

import pytest

from tests.brokers import AMQP_URL, REDIS_URL, require


@pytest.fixture
def redis_url() -> str:
    """URL of the real Redis; skips (fails on CI) when Redis is down."""
    require("Redis", "127.0.0.1", 6379)
    return REDIS_URL


@pytest.fixture
def amqp_url() -> str:
    """URL of the real RabbitMQ; skips (fails on CI) when RabbitMQ is down."""
    require("RabbitMQ", "127.0.0.1", 5672)
    return AMQP_URL
