"""The console without a browser: security rules, mounting, statistics, the dead-letter hook."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

import pytest
from markupsafe import escape
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient

from ojs_adapters import Decision, ErrorEntry, JobRecord
from ojs_adapters.runtime.alerts import DeadLetterEvent, on_dead_letter, remove_dead_letter_hook
from ojs_adapters.runtime.browse import WaitingFilter, WaitingPage, WaitingRetry, WaitingSource
from ojs_adapters.runtime.dlq import DeadLetter, DeadLetterFilter, DeadLetters, Page
from ojs_adapters.runtime.dlq.memory import MemoryDeadLetterStore
from ojs_adapters.runtime.events import DecisionEvent
from ojs_adapters.runtime.stats import DecisionStats, StatsReader
from ojs_adapters.web import ConsoleSettings, create_app, wsgi_app
from ojs_adapters.web._overview import read, summarize

TOKEN = "unit-test-token-0123456789"
ENTRY = ErrorEntry(attempt=1, code="HANDLER_ERROR", type="net.<b>Down</b>",
                   message="<script>alert(1)</script>", occurred_at="2026-01-02T00:00:00.000Z")


class FakeView:
    def __init__(self) -> None:
        self.moved: list[str] = []

    def sources(self) -> list[WaitingSource]:
        return [WaitingSource("parked", "Parked", listable=True, actionable=True, count=1)]

    def page(self, source: str, filters: WaitingFilter, *, page: int = 1,
             per_page: int = 50) -> WaitingPage:
        item = WaitingRetry("w1", "t", "q", 2, 3, "net.Down", "HANDLER_ERROR",
                            datetime.now(timezone.utc), "parked", "w1")
        return WaitingPage((item,), page, per_page, 1)

    def retry_now(self, source: str, ids: Sequence[str]) -> int:
        self.moved += ids
        return len(ids)

    def discard(self, source: str, ids: Sequence[str]) -> int:
        return 0


class FakeBackend:
    """A ``ConsoleBackend`` in memory: one dead letter whose error carries markup."""

    framework = "celery"

    def __init__(self) -> None:
        self.store = MemoryDeadLetterStore()
        self.store.add(DeadLetter(id="d1", queue="q", task_type="t", error_type=ENTRY.type,
                                  dead_lettered_at=datetime.now(timezone.utc), attempt=1,
                                  history=(ENTRY,), payload={"args": ["secret"]}))
        self.dead_letters = DeadLetters(self.store)
        self.view = FakeView()

    def retry_view(self, stats: Any) -> FakeView:
        return self.view

    def letters(self, filters: DeadLetterFilter, *, page: int = 1, per_page: int = 50) -> Page:
        return self.dead_letters.list(filters, page=page, per_page=per_page)

    def letter(self, job_id: str, queue: str | None = None,
               key: str | None = None) -> DeadLetter | None:
        return self.dead_letters.show(job_id)

    def describe(self, letter: DeadLetter) -> Any:
        from ojs_adapters.runtime.browse import LetterDetails

        return LetterDetails({"x-note": "<i>hi</i>"}, None, "k1", dict(letter.payload))

    def depths(self) -> dict[str, int]:
        return {"q": self.dead_letters.list().total}

    def record(self, job_id: str) -> JobRecord | None:
        return None

    def stats_client(self) -> None:
        return None

    def close(self) -> None:
        pass


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend()


def client_for(backend: FakeBackend, **settings: Any) -> TestClient:
    app = create_app(ConsoleSettings(framework="celery", **settings), opener=lambda: backend)
    return TestClient(app)


def csrf_of(text: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', text)
    assert found is not None
    return found.group(1)


def test_read_only_by_default_no_buttons_and_every_action_refused(backend: FakeBackend) -> None:
    client = client_for(backend)
    page = client.get("/dead-letters").text
    assert "read-only" in page and "replay" not in page and 'method="post"' not in page
    assert client.get("/confirm?action=replay&id=d1").status_code == 403
    refused = client.post("/actions/dead-letters", data={"action": "delete", "id": "d1"})
    assert refused.status_code == 403 and backend.dead_letters.list().total == 1
    assert client.get("/login").status_code == 404


def test_actions_need_the_token_and_the_csrf_token(backend: FakeBackend) -> None:
    client = client_for(backend, tokens={"alice": TOKEN})
    token = csrf_of(client.get("/login").text)
    delete = {"action": "delete", "id": "d1", "queue": "q"}
    assert client.post("/actions/dead-letters", data={**delete, "csrf": token}).status_code == 403
    wrong = client.post("/login", data={"token": "nope-nope-nope-nope", "csrf": token})
    assert wrong.status_code == 403
    assert client.post("/login", data={"token": TOKEN}).status_code == 403  # no CSRF token
    assert client.post("/login", data={"token": TOKEN, "csrf": token}).status_code == 200
    assert client.post("/actions/dead-letters", data=delete).status_code == 403  # no CSRF
    other = {**delete, "csrf": token}
    cross = client.post("/actions/dead-letters", data=other,
                        headers={"Origin": "http://evil.example"})
    assert cross.status_code == 403 and backend.dead_letters.list().total == 1
    confirm = client.get("/confirm?action=delete&id=d1&queue=q")
    assert "Delete 1 dead letter?" in confirm.text
    done = client.post("/actions/dead-letters", data=other)
    assert done.status_code == 200 and "Deleted 1 dead letter" in done.text
    assert backend.dead_letters.list().total == 0


def test_a_bulk_action_acts_only_on_the_count_confirmed(backend: FakeBackend) -> None:
    client = client_for(backend, auth=lambda request: "host-user")
    token = csrf_of(client.get("/confirm?action=replay&error=net.*").text)
    changed = client.post("/actions/dead-letters",
                          data={"action": "replay", "error": "net.*", "expected": "5",
                                "csrf": token})
    assert "selection changed" in changed.text and not backend.store.requeued
    done = client.post("/actions/dead-letters",
                       data={"action": "replay", "error": "net.*", "expected": "1",
                             "csrf": token})
    assert "Replayed 1 dead letter" in done.text and len(backend.store.requeued) == 1


def test_ojs_retry_web_answers_only_this_machines_host_names(backend: FakeBackend,
                                                             monkeypatch: Any) -> None:
    """A page whose DNS name rebinds to 127.0.0.1 sends its own name as Host: refused."""
    import uvicorn
    from click.testing import CliRunner

    from ojs_adapters.web._cmd import command

    served: list[Any] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **_: served.append(app))
    monkeypatch.setattr("ojs_adapters.web._app.open_console_backend", lambda *a, **k: backend)

    def serve(*extra: str) -> tuple[TestClient, str]:
        result = CliRunner().invoke(command, ["--framework", "celery", "--broker",
                                              "redis://127.0.0.1:6379/0", *extra])
        assert result.exit_code == 0, result.output
        return TestClient(served[-1], base_url="http://127.0.0.1:8642"), result.output

    def status(client: TestClient, host: str) -> int:
        return client.get("/dead-letters", headers={"Host": host}).status_code

    local, said = serve("--host", "127.0.0.1")
    assert "beyond this machine" not in said
    for name in ("127.0.0.1:8642", "LOCALHOST:8642", "[::1]:8642"):
        assert status(local, name) == 200, name
    rebound = local.get("/dead-letters", headers={"Host": "evil.example:8642"})
    assert rebound.status_code == 400 and "d1" not in rebound.text
    other_loopback, said = serve("--host", "127.0.0.2")  # any 127.x is this machine
    assert "beyond this machine" not in said
    assert status(other_loopback, "127.0.0.2:8642") == 200
    assert status(other_loopback, "evil.example") == 400
    proxied, _ = serve("--host", "127.0.0.1", "--allowed-host", "Ops.Example.com")
    assert status(proxied, "ops.example.com") == 200 and status(proxied, "localhost") == 200
    assert status(proxied, "evil.example") == 400
    anywhere, said = serve("--host", "0.0.0.0")
    assert status(anywhere, "evil.example") == 200 and "give --allowed-host" in said
    refused = CliRunner().invoke(command, ["--framework", "celery", "--broker", "redis://x",
                                           "--allowed-host", "ops.example.com:8642"])
    assert refused.exit_code == 2 and "--allowed-host" in refused.output
    assert "'ops.example.com:8642' is not a host name" in refused.output


def test_console_settings_name_the_hosts_it_answers(backend: FakeBackend) -> None:
    named = client_for(backend, allowed_hosts=iter(["*.Example.com"]))
    assert named.get("/", headers={"Host": "ops.example.com"}).status_code == 200
    assert named.get("/", headers={"Host": "example.org"}).status_code == 400
    for wrong in ("localhost", [], ["ops*.example.com"], ["::1"], ["http://ops.example.com"],
                  [""], ["ops.example.com."], [None], b"localhost"):
        with pytest.raises(ValueError, match="allowed_hosts"):
            ConsoleSettings(framework="celery", allowed_hosts=wrong)


def test_job_text_is_escaped_and_arguments_hidden(backend: FakeBackend) -> None:
    client = client_for(backend)
    for path in ("/dead-letters", "/dead-letter?id=d1"):
        text = client.get(path).text
        assert "<script>alert(1)</script>" not in text and "<b>Down</b>" not in text
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    detail = client.get("/dead-letter?id=d1").text
    assert "secret" not in detail and "&lt;i&gt;hi&lt;/i&gt;" in detail
    assert "secret" in client_for(backend, show_args=True).get("/dead-letter?id=d1").text
    headers = client.get("/").headers
    assert "script-src 'self'" in headers["content-security-policy"]


def test_mounts_under_a_prefix_in_asgi_and_wsgi_hosts(backend: FakeBackend) -> None:
    settings = ConsoleSettings(framework="celery")
    host = Starlette(routes=[Mount("/ojs", create_app(settings, opener=lambda: backend))])
    page = TestClient(host).get("/ojs/dead-letters").text
    assert 'href="/ojs/dead-letter?id=d1' in page and 'src="/ojs/static/htmx.min.js"' in page
    assert TestClient(host).get("/ojs/static/htmx.min.js").status_code == 200

    flask = pytest.importorskip("flask")
    from werkzeug.middleware.dispatcher import DispatcherMiddleware

    import ojs_adapters.web._app as app_module

    original = app_module.open_console_backend
    app_module.open_console_backend = lambda *a, **k: backend  # type: ignore[assignment]
    try:
        outer = flask.Flask("host")
        outer.wsgi_app = DispatcherMiddleware(outer.wsgi_app,  # type: ignore[method-assign]
                                              {"/ojs": wsgi_app(settings)})
        response = outer.test_client().get("/ojs/dead-letters")
        assert response.status_code == 200 and b'href="/ojs/dead-letter?id=d1' in response.data
    finally:
        app_module.open_console_backend = original  # type: ignore[assignment]


def test_the_csrf_cookie_set_on_a_static_file_is_the_whole_consoles(
        backend: FakeBackend) -> None:
    """A first visit that starts with a static file gets the one CSRF cookie, for the whole
    console (Path=/, or the mount's prefix), not one for /static and a second for the pages."""
    client = client_for(backend)
    first = client.get("/static/console.css")
    assert first.status_code == 200
    cookie = first.headers["set-cookie"]
    assert cookie.startswith("ojs_csrf=") and "Path=/;" in cookie
    assert "set-cookie" not in client.get("/dead-letters").headers

    settings = ConsoleSettings(framework="celery")
    host = Starlette(routes=[Mount("/ojs", create_app(settings, opener=lambda: backend))])
    mounted = TestClient(host)
    assert "Path=/ojs;" in mounted.get("/ojs/static/console.css").headers["set-cookie"]
    assert "set-cookie" not in mounted.get("/ojs/dead-letters").headers


def test_metrics_give_the_dead_letter_depth_per_queue(backend: FakeBackend) -> None:
    text = client_for(backend).get("/metrics").text
    assert 'ojs_dead_letter_depth{framework="celery",queue="q"} 1.0' in text
    assert 'ojs_dead_letter_depth_error{framework="celery"} 0.0' in text


def test_metrics_say_when_the_depths_could_not_be_read(backend: FakeBackend,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """No depth sample alone reads as "no dead letters"; the error gauge tells them apart."""
    def unreadable() -> dict[str, int]:
        raise ConnectionError("broker down")

    monkeypatch.setattr(backend, "depths", unreadable)
    text = client_for(backend).get("/metrics").text
    assert "ojs_dead_letter_depth{" not in text
    assert 'ojs_dead_letter_depth_error{framework="celery"} 1.0' in text


@pytest.fixture
def stats(redis_url: str) -> Iterator[tuple[DecisionStats, StatsReader]]:
    import redis

    client = redis.Redis.from_url(redis_url)
    prefix = f"ojs-test-stats-{uuid.uuid4().hex[:8]}"
    yield DecisionStats(client, prefix=prefix), StatsReader(client, prefix=prefix)
    for key in client.scan_iter(match=f"{prefix}*"):
        client.delete(key)


def _event(job: str, action: str, delay: float | None = None) -> DecisionEvent:
    decision = Decision(action=action, attempt=1, entry=ENTRY, delay=delay,  # type: ignore[arg-type]
                        reason="test")
    return DecisionEvent("dramatiq", job, "t", "q", 3, decision)


def test_statistics_count_in_memory_and_flush_in_one_go(
        stats: tuple[DecisionStats, StatsReader]) -> None:
    recorder, reader = stats
    for n in range(3):
        recorder(_event(f"j{n}", "retry", delay=60.0))
    recorder(_event("j0", "dead_letter"))
    assert recorder.pending() == 4  # nothing written yet: no I/O on the job's path
    recorder.flush()
    assert recorder.pending() == 0
    rows = summarize(*read(reader, "dramatiq"))
    assert [(r.task, r.hour.retries, r.day.dead_lettered) for r in rows] == [("t", 3, 1)]
    assert rows[0].top_errors == [("net.<b>Down</b>", 4)]
    total, waiting = reader.waiting("dramatiq", offset=0, count=10)
    assert total == 2 and {w[0] for w in waiting} == {"j1", "j2"}  # j0 was dead-lettered
    assert reader.waiting("dramatiq", offset=0, count=10, task="other*")[0] == 0
    assert reader.waiting("celery", offset=0, count=10)[0] == 0
    assert time.time() < waiting[0][1] <= time.time() + 61


def test_the_dead_letter_hook_is_called_with_no_arguments_dramatiq() -> None:
    import dramatiq
    from dramatiq.brokers.stub import StubBroker

    from dramatiq_ext import OjsRetries

    seen: list[DeadLetterEvent] = []
    hook = on_dead_letter(seen.append)
    broker = StubBroker()
    broker.add_middleware(OjsRetries())
    try:
        def job(card: str) -> None:
            raise RuntimeError("declined")

        actor = dramatiq.actor(job, broker=broker, actor_name="hooked",
                               retry_policy={"max_attempts": 1, "on_exhaustion": "dead_letter"})
        message = actor.send("4111-secret")
        worker = dramatiq.Worker(broker, worker_timeout=50)
        worker.start()
        broker.join(actor.queue_name, fail_fast=False)
        worker.join()
        worker.stop()
    finally:
        remove_dead_letter_hook(hook)
    assert len(seen) == 1
    event = seen[0]
    assert (event.framework, event.letter.id, event.dead_letter_queue) == (
        "dramatiq", message.message_id, "default.XQ")
    assert event.letter.error_type == "RuntimeError" and event.letter.payload == {}
    assert "4111" not in repr(event)


def test_a_bulk_delete_takes_only_the_letters_it_counted(backend: FakeBackend) -> None:
    """A dead letter that arrives between the count and the delete is not deleted with them."""
    client = client_for(backend, auth=lambda request: "host-user")
    token = csrf_of(client.get("/confirm?action=delete&error=net.*").text)
    counted = backend.letters

    def count_then_one_arrives(filters: DeadLetterFilter, **kwargs: Any) -> Page:
        page = counted(filters, **kwargs)
        backend.letters = counted  # type: ignore[method-assign]  # once
        backend.store.add(replace(page.items[0], id="late", key="late"))
        return page

    other = replace(backend.store.scan()[0], error_type="payment.Declined", key="d1-again")
    backend.store.add(other)  # the same job dead-lettered before, outside the filter
    backend.letters = count_then_one_arrives  # type: ignore[method-assign]
    done = client.post("/actions/dead-letters",
                       data={"action": "delete", "error": "net.*", "expected": "1",
                             "csrf": token})
    assert "Deleted 1 dead letter" in done.text
    assert sorted(x.key for x in backend.dead_letters.list().items) == ["d1-again", "late"]


@pytest.mark.parametrize("name", ["ops;admin", "a,b", "x y", "Ana María", "李雷", "p|q",
                                  'o"q\\', "100%25"])
def test_any_operator_name_round_trips_through_the_session_cookie(
        backend: FakeBackend, name: str) -> None:
    """The session cookie percent-encodes the name: a token file's ``name:token`` may hold
    ``;``, ``,``, ``|``, spaces or any script, and the login still holds."""
    client = client_for(backend, tokens={name: TOKEN})
    token = csrf_of(client.get("/login").text)
    login = client.post("/login", data={"token": TOKEN, "csrf": token}, follow_redirects=False)
    assert login.status_code == 303
    cookie = login.headers["set-cookie"].split(";", 1)[0].partition("=")[2]
    assert cookie.isascii() and not set(cookie) & set(' ,;"\\'), cookie
    confirm = client.get("/confirm?action=delete&id=d1&queue=q")
    assert confirm.status_code == 200 and "Delete 1 dead letter?" in confirm.text
    assert escape(name) in confirm.text  # the header names the operator
    done = client.post("/actions/dead-letters",
                       data={"action": "delete", "id": "d1", "queue": "q", "csrf": token})
    assert "Deleted 1 dead letter" in done.text and backend.dead_letters.list().total == 0


def test_session_clock_given_as_zero_is_read_as_zero() -> None:
    """``now=0.0`` is a time (the epoch), not 'no time given': a session made then expires
    ``SESSION_SECONDS`` later, and a check at 0.0 accepts it (``now or time.time()``
    read 0.0 as now, making that session a current one and checking it against today)."""
    from ojs_adapters.web._security import SESSION_SECONDS, Guard

    guard = Guard(ConsoleSettings(framework="celery", tokens={"ops": "t" * 20},
                                  secret=b"k" * 32))
    cookie = guard.session("ops", now=0.0)
    assert cookie.split("|")[1] == str(SESSION_SECONDS)
    assert guard.from_session(cookie, now=0.0) == "ops"
    assert guard.from_session(cookie) is None  # long expired by today's clock


def test_ojs_retry_web_refuses_an_option_key_it_would_ignore(backend: FakeBackend,
                                                             monkeypatch: Any) -> None:
    """``--option nmespace=x`` (a typo) was dropped, the console then looking in the default
    namespace: it is refused, naming the key and the keys the framework reads."""
    import uvicorn
    from click.testing import CliRunner

    from ojs_adapters.web._cmd import command

    served: list[Any] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **_: served.append(app))
    monkeypatch.setattr("ojs_adapters.web._app.open_console_backend", lambda *a, **k: backend)
    base = ["--framework", "dramatiq", "--broker", "redis://127.0.0.1:6379/0"]
    typo = CliRunner().invoke(command, [*base, "--option", "nmespace=x"])
    assert typo.exit_code == 2 and not served, typo.output
    assert "Invalid value for '--option': unknown key 'nmespace' for dramatiq; valid keys: " \
           "management, namespace, records, records_prefix" in typo.output
    right = CliRunner().invoke(command, [*base, "--option", "namespace=x"])
    assert right.exit_code == 0 and len(served) == 1, right.output
