"""A real Redis client and a fresh key, for the runtime's Redis tests."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture
def client(redis_url: str) -> Iterator[Any]:
    import redis

    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def key(client: Any) -> Iterator[str]:
    name = f"ojs-test-runtime-{uuid.uuid4().hex}"
    yield name
    client.delete(name)
