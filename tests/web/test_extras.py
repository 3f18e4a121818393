"""The console with only the extras its setup's docs name (docs/operations/console.md)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid

from tests.brokers import REDIS_URL, require
from tests.quickstart.support import BLOCKER

# The console's whole path on a Dramatiq Redis broker: its pages' backend and /metrics.
_SCRIPT = textwrap.dedent("""
    import sys
    from starlette.testclient import TestClient
    from ojs_adapters.web import ConsoleSettings, create_app
    settings = ConsoleSettings(framework="dramatiq", broker=sys.argv[1], queues=(sys.argv[2],))
    client = TestClient(create_app(settings))
    for page in ("/", "/waiting", "/dead-letters"):
        print(page, client.get(page).status_code)
    print(client.get("/metrics").text)
    import pika  # the script's own check that the blocker holds
""")


def test_the_dramatiq_console_on_redis_needs_no_rabbitmq_client() -> None:
    """``pip install 'ojs-adapters[dramatiq-redis,web]'`` has no pika: the console's backend
    must not import the RabbitMQ dead-letter store to tell a Redis broker from it."""
    require("Redis", "127.0.0.1", 6379)
    queue = f"extras_{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "OJS_BLOCK": "pika",
           "PYTHONPATH": os.pathsep.join([str(BLOCKER), *sys.path])}
    done = subprocess.run([sys.executable, "-c", _SCRIPT, REDIS_URL, queue], env=env,
                          capture_output=True, text=True, timeout=120)
    assert f'ojs_dead_letter_depth{{framework="dramatiq",queue="{queue}"}} 0.0' in done.stdout, \
        done.stderr[-2000:]
    for page in ("/", "/waiting", "/dead-letters"):
        assert f"{page} 200" in done.stdout
    assert "No module named 'pika' (blocked by OJS_BLOCK)" in done.stderr  # the script's check
