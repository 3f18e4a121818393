"""No 500 from the console: bad input is a 400 naming the field and the rule, broker trouble a
503 naming the broker and what to check, a refused replay a 409 saying why and what to do.

Run through the real app on real brokers (a closed port for an unreachable one).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from dramatiq_ext import OjsRetries
from ojs_adapters import JobError
from ojs_adapters.web import ConsoleSettings, create_app
from ojs_adapters.web._security import CSRF_COOKIE
from tests.dramatiq_ext.harness import Env, make_env, pika_url
from tests.web.support import free_port, wait_for


def console(**settings: Any) -> TestClient:
    """A writable console (a host app's auth callable) whose 500s reach the test as 500s."""
    app = create_app(ConsoleSettings(auth=lambda request: "ops", **settings))
    return TestClient(app, raise_server_exceptions=False)


def csrf(client: TestClient) -> str:
    """The CSRF field of ``client``'s cookie (the one the console's forms carry)."""
    client.get("/jobs")  # a page that reads nothing sets the cookie
    guard = client.app.state.console.guard  # type: ignore[attr-defined]
    return str(guard.csrf_token(client.cookies[CSRF_COOKIE]))


@pytest.mark.broker
def test_a_bad_date_or_count_is_a_400_naming_the_field(redis_url: str) -> None:
    client = console(framework="celery", broker=redis_url)
    for path in ("/confirm?action=delete&since=bogus", "/dead-letters?since=bogus",
                 "/confirm?action=replay&until=2026-13-45"):
        page = client.get(path)
        field = "since" if "since" in path else "until"
        assert page.status_code == 400, (path, page.status_code)
        assert f"{field} must be a date (YYYY-MM-DD" in page.text, path
    token = csrf(client)
    for expected in ("abc", "-1", "1.5", "²"):
        posted = client.post("/actions/dead-letters", data={
            "action": "delete", "error": "nothing.Matches*", "expected": expected,
            "csrf": token}, follow_redirects=False)
        assert posted.status_code == 400, (expected, posted.status_code)
        assert "expected must be a whole number from 0" in posted.text, expected
    posted = client.post("/actions/dead-letters", data={
        "action": "replay", "since": "yesterday", "expected": "1", "csrf": token})
    assert posted.status_code == 400 and "since must be a date" in posted.text


def test_an_unreachable_broker_is_a_503_naming_it_on_pages_and_actions() -> None:
    port = free_port()  # nothing listens there
    cases = [("celery", f"redis://:s3cret@127.0.0.1:{port}/0"),
             ("dramatiq", f"amqp://ops:s3cret@127.0.0.1:{port}/%2F")]
    for framework, url in cases:
        client = console(framework=framework, broker=url)
        token = csrf(client)
        answers = {
            "confirm": client.get("/confirm?action=delete&error=net.*"),
            "replay ids": client.post("/actions/dead-letters", data={
                "action": "replay", "id": "job-1", "csrf": token}),
            "delete filter": client.post("/actions/dead-letters", data={
                "action": "delete", "error": "net.*", "expected": "3", "csrf": token}),
            "discard": client.post("/actions/waiting", data={
                "action": "discard", "source": "parked", "id": "job-1", "csrf": token}),
            "page": client.get("/dead-letters"),
        }
        for what, answer in answers.items():
            assert answer.status_code == 503, (framework, what, answer.status_code)
            text = answer.text
            assert f"127.0.0.1:{port}" in text and "is it running, and reachable" in text, what
            assert "s3cret" not in text, what
        user = "ops" if framework == "dramatiq" else ""
        assert f"{user}:***@127.0.0.1" in answers["replay ids"].text, framework
        assert "look at the dead letters again" in answers["replay ids"].text
        assert "Nothing was changed" in answers["page"].text


@pytest.fixture
def dead_on_rabbitmq(redis_url: str, amqp_url: str) -> Iterator[tuple[Env, str]]:
    """One dead letter in a queue of its own on RabbitMQ, put there by a real worker."""
    with make_env("rabbitmq", redis_url=redis_url, amqp_url=amqp_url,
                  ojs=OjsRetries()) as env:
        def fail() -> None:
            raise JobError("net.Timeout", "no route")

        actor = env.actor(fail, retry_policy={"max_attempts": 1,
                                              "on_exhaustion": "dead_letter"})
        message = actor.send()
        env.start(threads=1)
        wait_for(lambda: getattr(env.record(message.message_id), "dead_lettered", False),
                 "the job to be dead-lettered")
        for worker in env.workers:
            worker.stop(timeout=5000)  # its dead delivery is in the .XQ once it stops
        env.workers.clear()
        yield env, message.message_id


@pytest.mark.broker
def test_a_replay_the_workers_records_are_out_of_reach_for_is_a_409(
        dead_on_rabbitmq: tuple[Env, str], amqp_url: str) -> None:
    """A console opened from the RabbitMQ URL alone cannot stamp the workers' records
    (they are in Dramatiq's Results on Redis): the replay is refused, the letter stays."""
    env, job_id = dead_on_rabbitmq
    client = console(framework="dramatiq", broker=pika_url(amqp_url), queues=[env.queue])
    assert job_id in client.get(f"/dead-letters?queue={env.queue}").text
    token = csrf(client)
    for form in ({"id": job_id}, {"queue": env.queue, "expected": "1"}):
        refused = client.post("/actions/dead-letters",
                              data={"action": "replay", "csrf": token, **form})
        assert refused.status_code == 409, (form, refused.status_code)
        assert "Nothing was changed" in refused.text
        assert "--option records=REDIS_URL" in refused.text and "ojs-retry web" in refused.text
    # nothing moved: still dead, not queued
    assert job_id in client.get(f"/dead-letters?queue={env.queue}").text
    assert env.broker.channel.queue_declare(env.queue, passive=True).method.message_count == 0


@pytest.mark.broker
def test_a_partial_look_for_dead_letter_queues_is_said_on_pages_and_metrics(
        amqp_url: str, redis_url: str) -> None:
    """Celery on RabbitMQ with the management API unreachable: the console could look only
    in the queues it knows of; it says so and how to see them all, and /metrics says the
    depths may be missing a queue (``ojs_dead_letter_depth_complete`` 0)."""
    closed = f"http://127.0.0.1:{free_port()}"
    client = console(framework="celery", broker=amqp_url, options={"management": closed})
    for path in ("/", "/dead-letters"):
        page = client.get(path)
        assert page.status_code == 200, path
        assert 'id="coverage"' in page.text, path
        assert f"the management API at {closed} did not answer" in page.text, path
        assert "--option management=URL" in page.text and "--queue NAME" in page.text, path
    metrics = client.get("/metrics").text
    assert 'ojs_dead_letter_depth_error{framework="celery"} 0.0' in metrics
    assert 'ojs_dead_letter_depth_complete{framework="celery"} 0.0' in metrics

    every = console(framework="celery", broker=redis_url)  # Redis lists its keys: all seen
    assert 'id="coverage"' not in every.get("/").text
    assert 'ojs_dead_letter_depth_complete{framework="celery"} 1.0' in every.get(
        "/metrics").text


def test_a_bug_of_the_console_s_own_is_a_500_saying_so_not_a_broker_outage(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An error of Python's own types while reading is the console's bug: the page says so
    (as the CLI's exit 70 does) instead of sending the operator to check a healthy broker."""
    client = console(framework="celery", broker="redis://127.0.0.1:6379/0")
    state = client.app.state.console  # type: ignore[attr-defined]

    def broken() -> Any:
        raise KeyError("queues")

    monkeypatch.setattr(state, "_opener", broken)
    page = client.get("/dead-letters")
    assert page.status_code == 500
    assert "this is a bug, please report it" in page.text and "KeyError" in page.text
    assert "Check that it is running" not in page.text
