"""Fixtures shared by the driver tests: one broker URL per embedded and real broker."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["memory", "redis", "amqp"])
def broker_url(request: pytest.FixtureRequest) -> str:
    """``memory``, or the real broker's URL (skips, or fails on CI, when it is down)."""
    if request.param == "memory":
        return "memory"
    url: str = request.getfixturevalue(f"{request.param}_url")
    return url
