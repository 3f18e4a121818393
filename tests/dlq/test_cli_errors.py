"""``ojs-retry dlq`` says in a sentence what a broker refused, on the real brokers.

Which broker (its URL, password hidden), what failed (login, vhost, nothing listening)
and what to check; never a client library's exception class name.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from click.testing import CliRunner, Result

from ojs_adapters.cli import main
from ojs_adapters.runtime.dlq import DeadLetters
from ojs_adapters.runtime.dlq.memory import MemoryDeadLetterStore
from tests.dramatiq_ext.harness import pika_url

#: The broker ``--app tests.dlq.test_cli_errors:BROKER`` names while a test runs.
BROKER: Any = None
#: Class names users saw before: ``ProbableAuthenticationError: ...``.
CLASS_NAMES = ("ProbableAuthenticationError", "ProbableAccessDeniedError", "AccessRefused",
               "NotAllowed", "AMQPConnectionError", "ConnectionError", "OperationalError",
               "ConnectionRefusedError", "ConnectionClosedByBroker")


def _list(framework: str, *connection: str) -> Result:
    return CliRunner().invoke(main, ["dlq", "list", "--framework", framework, *connection,
                                     "--option", "management=none"])


def _with(url: str, *, password: str | None = None, path: str | None = None) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc if password is None else \
        f"{parts.username}:{password}@{parts.hostname}:{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc, path=parts.path if path is None else path))


def _plain(result: Result, *said: str) -> None:
    assert result.exit_code == 1, result.output
    for text in said:
        assert text in result.output, result.output
    assert not [name for name in CLASS_NAMES if name in result.output], result.output
    assert "Traceback" not in result.output and "s3cret" not in result.output


@pytest.mark.broker
@pytest.mark.parametrize("framework", ["celery", "dramatiq"])
def test_a_refused_login_or_vhost_reads_as_a_sentence(framework: str, amqp_url: str) -> None:
    url = pika_url(amqp_url)
    hidden = _with(url, password="***")
    login = _list(framework, "--broker", _with(url, password="s3cret"))
    _plain(login, f"Error: the broker at {hidden} refused the login (ACCESS_REFUSED",
           "check the user name and password")
    vhost = _list(framework, "--broker", _with(url, path="/ojs-no-such-vhost"))
    _plain(vhost, f"the broker at {_with(hidden, path='/ojs-no-such-vhost')} refused the vhost "
                  "(NOT_ALLOWED - vhost ojs-no-such-vhost not found): check that the vhost in "
                  "the URL exists and that the user may use it")


@pytest.mark.broker
@pytest.mark.parametrize("framework", ["celery", "dramatiq"])
def test_nothing_listening_asks_whether_the_broker_runs(framework: str, redis_url: str,
                                                       amqp_url: str) -> None:
    for url in (_with(redis_url, password="s3cret").replace(":6379", ":1"),
                _with(pika_url(amqp_url), password="s3cret").replace(":5672", ":1")):
        shown = _with(url, password="***")
        _plain(_list(framework, "--broker", url),
               f"cannot connect to the broker at {shown} (", "Connection refused",
               "is it running, and reachable at that host and port?")


@pytest.mark.broker
@pytest.mark.parametrize("framework", ["celery", "dramatiq"])
def test_a_broker_named_by_app_is_named_by_its_url(framework: str, amqp_url: str) -> None:
    """``--app`` gives no URL on the command line: the broker's own is said (no password;
    kombu spells vhost ``/`` ``//``)."""
    global BROKER
    from celery import Celery
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    url = _with(pika_url(amqp_url), password="s3cret")
    BROKER = Celery("errors", broker=url, set_as_current=False) if framework == "celery" \
        else RabbitmqBroker(url=url)
    try:
        result = _list(framework, "--app", "tests.dlq.test_cli_errors:BROKER")
    finally:
        if framework == "dramatiq":
            BROKER.close()
        BROKER = None
    parts = urlsplit(url)
    said = f"amqp://{parts.username}:***@{parts.hostname}:{parts.port}//" if framework == "celery" \
        else f"amqp://{parts.username}@{parts.hostname}:{parts.port}/%2F"
    _plain(result, f"the broker at {said} refused the login")


def test_a_bug_is_said_to_be_one_not_a_broker_s_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    class Broken(MemoryDeadLetterStore):
        def scan(self, queue: str | None = None) -> Any:
            raise KeyError("headers")

    monkeypatch.setattr("ojs_adapters.cli._dlq_cmd.open_dead_letter_queue",
                        lambda *_args, **_kwargs: DeadLetters(Broken()))
    result = CliRunner().invoke(main, ["dlq", "list", "--framework", "memory"])
    assert result.exit_code == 70  # EXIT_INTERNAL, as the other verbs exit for a bug
    assert "internal error in ojs-retry: KeyError: 'headers' (please report it)" in result.output


def test_a_dramatiq_broker_over_tls_is_named_with_its_tls_scheme() -> None:
    """A broker built by the app (``--app``) is named from its client's parameters: over TLS
    that is ``amqps://`` or ``rediss://``, never the plain scheme of another port."""
    from dramatiq.brokers.rabbitmq import RabbitmqBroker
    from dramatiq.brokers.redis import RedisBroker

    from dramatiq_ext.dlq import _url_of

    class Store:
        broker: Any = None

    store = Store()
    for url, said in (("rediss://:pw@mq.example.com:6380/2", "rediss://mq.example.com:6380/2"),
                      ("redis://mq.example.com:6379/0", "redis://mq.example.com:6379/0")):
        store.broker = RedisBroker(url=url)  # builds its client, connects on first use
        assert _url_of(store) == said  # type: ignore[arg-type]
    store.broker = RabbitmqBroker(url="amqps://ops:pw@mq.example.com:5671/%2F")
    assert _url_of(store) == "amqps://ops@mq.example.com:5671/%2F"  # type: ignore[arg-type]
