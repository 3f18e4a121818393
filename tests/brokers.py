"""Which real brokers the integration tests can reach, and what to do when one is missing.

A test that needs a broker skips with the reason when it is unreachable, except
under ``CI=true`` or ``OJS_REQUIRE_BROKERS=1``, where it fails: CI must never
pass by skipping the tests that matter.
"""

from __future__ import annotations

import os
import socket
from functools import cache

import pytest

#: Default URLs of the brokers on this machine and on CI's.
REDIS_URL = os.environ.get("OJS_REDIS_URL", "redis://127.0.0.1:6379/0")
AMQP_URL = os.environ.get("OJS_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")


def brokers_required() -> bool:
    """Whether a missing broker is a failure rather than a skip."""
    return os.environ.get("CI", "").lower() == "true" or os.environ.get(
        "OJS_REQUIRE_BROKERS", ""
    ) in ("1", "true", "yes")


@cache
def reachable(host: str, port: int) -> bool:
    """Whether something accepts TCP connections at ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def require(name: str, host: str, port: int) -> None:
    """Skip (or fail, on CI) the calling test when the broker is unreachable."""
    if reachable(host, port):
        return
    reason = f"{name} is not reachable at {host}:{port}"
    if brokers_required():
        pytest.fail(f"{reason}, and CI=true / OJS_REQUIRE_BROKERS=1 forbid skipping")
    pytest.skip(f"{reason}; start it (see README) to run this test")
