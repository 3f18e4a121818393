"""The lanes every lifecycle test runs on: each framework on each real broker."""

from __future__ import annotations

import pytest

#: (framework, broker) pairs; the job records live in the real Redis in every lane.
LANES = [("celery", "redis"), ("celery", "amqp"), ("dramatiq", "redis"), ("dramatiq", "amqp")]


@pytest.fixture(params=LANES, ids=[f"{f}-{k}" for f, k in LANES])
def lane_kind(request: pytest.FixtureRequest, redis_url: str) -> tuple[str, str]:
    """A lane's framework and broker; skips (fails on CI) when its broker is down."""
    framework, kind = request.param
    if kind == "amqp":
        request.getfixturevalue("amqp_url")
    return framework, kind
