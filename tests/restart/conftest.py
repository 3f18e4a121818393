"""Fixtures: private brokers the restart tests may stop (the shared ones are never touched).

``private_redis`` is a fresh ``redis-server`` with AOF per test; ``private_rabbit``
one RabbitMQ node for the session (it takes about 5 s to boot). Each skips when its
binary is missing, and fails instead under ``CI=true`` (``tests.brokers``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.restart.servers import PrivateRabbit, PrivateRedis, rabbitmq_scripts, redis_binary
from tests.restart.support import require_binary


@pytest.fixture
def private_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateRedis]:
    """A ``redis-server`` of this test's own, AOF on with ``appendfsync always``."""
    require_binary("redis-server", redis_binary())
    server = PrivateRedis(tmp_path_factory.mktemp("redis"))
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def private_rabbit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateRabbit]:
    """A RabbitMQ node of the session's own (stopped and removed at the end)."""
    require_binary("rabbitmq-server", rabbitmq_scripts())
    server = PrivateRabbit(tmp_path_factory.mktemp("rabbit"))
    try:
        server.start()
        yield server
    finally:
        server.close()
