"""Finding dead-letter queues without ``--queue`` (issue 16, item 6): the core helpers.

The management-API client is tested against a stand-in HTTP server (the plugin is
not enabled on every broker, including the test one); the broker tests that use
it are in ``test_cli_discovery``.
"""

from __future__ import annotations

import base64
import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from ojs_adapters.runtime.dlq import (
    AmqpAddress,
    Coverage,
    glob_for,
    list_queues,
    load_object,
    management_url,
    originals,
)


class FakeManagement:
    """A stand-in for RabbitMQ's management API: answers ``GET /api/queues/<vhost>``."""

    def __init__(self, names: list[str], status: int = 200) -> None:
        self.names = names
        self.status = status
        self.requests: list[tuple[str, str | None]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                fake.requests.append((self.path, self.headers.get("Authorization")))
                body = json.dumps([{"name": n} for n in fake.names]).encode()
                self.send_response(fake.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                """Quiet."""

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def api() -> Iterator[FakeManagement]:
    fake = FakeManagement(["orders", "orders.DQ", "orders.XQ", "celery.dead_letter"])
    yield fake
    fake.close()


GUEST = AmqpAddress("127.0.0.1", "/", "guest", "guest")


def test_list_queues_reads_the_vhost_with_the_amqp_credentials(api: FakeManagement) -> None:
    listing = list_queues(GUEST, url=api.url)
    assert listing.names == ("orders", "orders.DQ", "orders.XQ", "celery.dead_letter")
    assert "listed by the management API" in listing.source
    path, auth = api.requests[0]
    assert path == "/api/queues/%2F?columns=name"
    assert auth == "Basic " + base64.b64encode(b"guest:guest").decode()


def test_list_queues_credentials_in_the_url_win(api: FakeManagement) -> None:
    list_queues(GUEST._replace(vhost="shop"), url=api.url.replace("//", "//admin:s%40cret@"))
    path, auth = api.requests[0]
    assert path == "/api/queues/shop?columns=name"
    assert auth == "Basic " + base64.b64encode(b"admin:s@cret").decode()


def test_list_queues_reports_why_it_has_no_answer(api: FakeManagement) -> None:
    api.status = 401  # a user without the management tag
    refused = list_queues(GUEST, url=api.url)
    assert refused.names is None and "answered HTTP 401" in refused.source
    assert "'management' tag" in refused.source
    api.close()
    gone = list_queues(GUEST, url=api.url, timeout=0.5)
    assert gone.names is None and f"{api.url} did not answer" in gone.source


def test_originals_and_globs_follow_the_templates() -> None:
    names = ["orders.XQ", "a.dead_letter", "dlq.b", "dlq.", ".XQ", "plain"]
    assert originals(names, ["{queue}.XQ"]) == {"orders.XQ": "orders"}
    assert originals(names, ["{queue}.dead_letter", "dlq.{queue}"]) == {
        "a.dead_letter": "a", "dlq.b": "b"}
    assert glob_for("ns:{queue}.XQ") == "ns:*.XQ"
    assert glob_for("{queue}?*") == "*\\?\\*"


def test_management_url_sits_beside_the_broker() -> None:
    assert management_url(GUEST) == "http://127.0.0.1:15672"
    assert management_url(AmqpAddress("::1", "/", "u", "p", tls=True)) == "https://[::1]:15671"


def test_coverage_describes_where_it_looked() -> None:
    partial = Coverage(("default.XQ", "orders.XQ"), False, "RabbitMQ cannot list queues")
    assert partial.describe() == "looked in: default.XQ, orders.XQ (RabbitMQ cannot list queues)"
    assert partial.to_dict() == {"complete": False, "looked_in": ["default.XQ", "orders.XQ"],
                                 "source": "RabbitMQ cannot list queues"}


def test_load_object_imports_from_the_current_directory(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--app app:app`` from the app's folder, as ``celery -A app`` works there."""
    (tmp_path / "ojs_cwd_app.py").write_text("app = object()\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".")])
    found = load_object("ojs_cwd_app:app")
    module = load_object("ojs_cwd_app")
    assert found is module.app and str(tmp_path) not in sys.path  # put back afterwards
