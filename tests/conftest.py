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


@pytest.fixture(autouse=True)
def _celery_worker_state_reset() -> None:
    """Start each test with Celery's process-wide shutdown flag clear.

    ``celery.contrib.testing.worker`` leaves ``should_terminate = 0`` when a worker
    thread fails to stop in time; every in-process worker started after that would
    stop at once, and one failure would turn into a cascade of hangs.
    """
    import sys

    state = sys.modules.get("celery.worker.state")
    if state is not None and getattr(state, "should_terminate", None) is not None:
        state.should_terminate = None  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def _no_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Start each test with no ``COLUMNS``: ``ojs-retry`` prints to a pipe as wide as it
    says (120 without it), and the CLI tests read tables at that width whatever the shell
    running them exported. A test that wants a width passes ``COLUMNS`` itself."""
    monkeypatch.delenv("COLUMNS", raising=False)
