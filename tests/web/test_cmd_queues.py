"""``ojs-retry web`` and ``ojs-retry dlq`` take original queues: a dead-letter queue's name
(Celery's ``.dead_letter`` or the app's template, Dramatiq's ``.XQ``) or Dramatiq's delay
queue (``.DQ``) given as ``--queue`` is refused at once with exit 2, naming the queue to pass.
The console used to start and answer every page with a 503 (the adapter refused the name
when the backend opened), and ``dlq`` looked in ``q.DQ``'s dead-letter queue: 0 rows."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from click.testing import CliRunner, Result

from ojs_adapters.cli import main

#: The Celery app or Dramatiq broker ``--app tests.web.test_cmd_queues:TARGET`` names.
TARGET: Any = None


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The apps ``ojs-retry web`` would serve (uvicorn is not started)."""
    import uvicorn

    apps: list[Any] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **_: apps.append(app))
    return apps


def web(framework: str, *args: str) -> Result:
    return CliRunner().invoke(main, ["web", "--framework", framework, *args])


def refused(result: Result, queue: str, *, said: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert f"Invalid value for '--queue': '{queue}' is {said}" in " ".join(result.output.split())


@pytest.mark.broker
def test_web_refuses_a_dead_letter_queue_at_startup_as_dlq_does(
        redis_url: str, amqp_url: str, served: list[Any]) -> None:
    global TARGET
    import dramatiq
    from celery import Celery
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    queue = f"trial_{uuid.uuid4().hex[:8]}"
    said = f"the dead-letter queue of '{queue}': pass --queue {queue}"
    for framework, dead in (("celery", f"{queue}.dead_letter"), ("dramatiq", f"{queue}.XQ")):
        refused(web(framework, "--broker", redis_url, "--queue", dead), dead, said=said)
        dlq = CliRunner().invoke(main, ["dlq", "list", "--framework", framework, "--broker",
                                        redis_url, "--queue", dead])
        refused(dlq, dead, said=said)  # the same words
    assert not served

    TARGET = Celery("trial", broker=amqp_url, set_as_current=False)
    TARGET.conf.ojs_dead_letter_queue = "dlq.{queue}"
    app = ("--app", "tests.web.test_cmd_queues:TARGET")
    try:
        refused(web("celery", *app, "--queue", f"dlq.{queue}"), f"dlq.{queue}", said=said)
        assert not served
        started = web("celery", *app, "--queue", f"{queue}.dead_letter")  # not its name here
        assert started.exit_code == 0 and len(served) == 1, started.output
        TARGET = RabbitmqBroker(url=amqp_url)
        dramatiq.set_broker(TARGET)
        refused(web("dramatiq", *app, "--queue", f"{queue}.XQ"), f"{queue}.XQ", said=said)
        started = web("dramatiq", *app, "--queue", queue)
        assert started.exit_code == 0 and len(served) == 2, started.output
    finally:
        if TARGET is not None and not isinstance(TARGET, Celery):
            TARGET.close()
        TARGET = None


@pytest.mark.broker
def test_dramatiq_s_delay_queue_is_refused_saying_what_it_is(
        redis_url: str, amqp_url: str, served: list[Any]) -> None:
    """``q.DQ`` holds messages waiting out a delay, never dead letters: ``dlq`` looked for
    ``q.DQ.XQ`` and listed nothing; now both verbs say what ``.DQ`` is and to pass ``q``."""
    queue = f"trial_{uuid.uuid4().hex[:8]}"
    delay = f"{queue}.DQ"
    said = f"Dramatiq's delay queue of '{queue}' (where messages wait out a retry's or a " \
           f"send's delay; dead letters go to '{queue}.XQ'): pass --queue {queue}"
    for broker in (redis_url, amqp_url):
        refused(web("dramatiq", "--broker", broker, "--queue", delay), delay, said=said)
        for verb in ("list", "purge --yes", "prune"):
            result = CliRunner().invoke(main, ["dlq", *verb.split(), "--framework",
                                               "dramatiq", "--broker", broker, "--queue",
                                               delay])
            refused(result, delay, said=said)
    assert not served
    started = web("celery", "--broker", redis_url, "--queue", delay)  # Celery makes no .DQ
    assert started.exit_code == 0 and len(served) == 1, started.output


def test_web_starts_when_the_broker_is_down_and_its_pages_say_so(served: list[Any]) -> None:
    """The check of ``--queue`` at startup stops on a refused name only: a broker that is
    down still lets the console start (its pages say why), as without ``--queue``."""
    started = web("dramatiq", "--broker", "redis://127.0.0.1:1/0", "--queue", "emails")
    assert started.exit_code == 0 and len(served) == 1, started.output
