"""The Dramatiq console on RabbitMQ counts dead letters by passive declares of each ``.XQ``;
a queue that was never declared (no job of it died yet) is an answer there, not a warning.
pika logged one WARNING ("Received remote Channel.Close (404)") per such queue on every
``/metrics`` scrape and page view."""

from __future__ import annotations

import logging
import uuid
from typing import cast

import pika
import pytest
from starlette.testclient import TestClient

from dramatiq_ext._console import DramatiqConsole
from dramatiq_ext.dlq import dead_letter_queue
from ojs_adapters.runtime.browse import ConsoleBackend
from ojs_adapters.web import ConsoleSettings, create_app
from tests.dramatiq_ext.harness import make_env, pika_url


def _closed_404(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.WARNING
            and "Channel.Close (404)" in r.getMessage()]


@pytest.mark.broker
def test_missing_dead_letter_queues_log_no_pika_warning(
        redis_url: str, amqp_url: str, caplog: pytest.LogCaptureFixture) -> None:
    token = uuid.uuid4().hex[:8]
    missing = [f"ojs_quiet_{token}_{n}" for n in range(3)]
    present = f"ojs_quiet_{token}_dead"
    connection = pika.BlockingConnection(pika.URLParameters(pika_url(amqp_url)))
    channel = connection.channel()
    channel.queue_declare(f"{present}.XQ", auto_delete=True)
    channel.basic_publish("", f"{present}.XQ", b"{}")
    try:
        with make_env("rabbitmq", redis_url=redis_url, amqp_url=amqp_url) as env:
            console = DramatiqConsole(dead_letter_queue(env.broker,
                                                        queues=[*missing, present]))
            app = create_app(ConsoleSettings(framework="dramatiq"),
                             opener=lambda: cast(ConsoleBackend, console))
            with caplog.at_level(logging.INFO, logger="pika"):
                metrics = TestClient(app).get("/metrics").text
                depths = console.depths()
            assert f'queue="{missing[0]}"}} 0.0' in metrics
            assert {q: depths[q] for q in [*missing, present]} == {
                **dict.fromkeys(missing, 0), present: 1}
            assert not _closed_404(caplog), [r.getMessage() for r in _closed_404(caplog)]

            # the quiet is the check's only: a 404 met elsewhere is still logged
            with caplog.at_level(logging.INFO, logger="pika"), \
                    pytest.raises(pika.exceptions.ChannelClosedByBroker):
                connection.channel().queue_declare(f"{missing[0]}.XQ", passive=True)
            assert len(_closed_404(caplog)) == 1
    finally:
        if channel.is_open:
            channel.queue_delete(f"{present}.XQ")
        connection.close()


@pytest.mark.broker
def test_looking_for_the_default_queue_s_dead_letters_logs_no_pika_warning(
        redis_url: str, amqp_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """Without the management API, ``ojs-retry dlq`` and the console ask whether
    ``default.XQ`` exists (a passive declare): a "no" is not a warning there either."""
    connection = pika.BlockingConnection(pika.URLParameters(pika_url(amqp_url)))
    try:
        connection.channel().queue_delete("default.XQ", if_empty=True)
    except pika.exceptions.ChannelClosedByBroker:
        pytest.skip("default.XQ holds someone's dead letters")
    finally:
        connection.close()
    with make_env("rabbitmq", redis_url=redis_url, amqp_url=amqp_url) as env:
        found = dead_letter_queue(env.broker, discover=True, management="none")
        with caplog.at_level(logging.INFO, logger="pika"):
            assert "default" not in found.queues()
        found.close()
    assert not _closed_404(caplog), [r.getMessage() for r in _closed_404(caplog)]
