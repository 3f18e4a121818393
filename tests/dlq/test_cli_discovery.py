"""``ojs-retry dlq`` without ``--queue`` finds dead letters on RabbitMQ (issue 16, item 6).

Real Dramatiq workers dead-letter real messages on the test RabbitMQ; the CLI
then runs as a user would: by URL alone, with a (stand-in) management API, and
with ``--app`` from the app's own folder in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import dramatiq
import pika
import pytest
from celery import Celery
from click.testing import CliRunner, Result
from pika.exceptions import ChannelClosedByBroker

from celery_ext.dlq import JobRecords
from dramatiq_ext import OjsRetries, get_job_record
from ojs_adapters import JobError, OjsValidationError
from ojs_adapters.cli import main
from ojs_adapters.runtime.dlq import DeadLetter, ReplayMark
from tests.dlq.scenario import wait_for
from tests.dlq.test_discovery import FakeManagement
from tests.dlq.test_dramatiq_dlq import POLICY, quiet
from tests.dramatiq_ext.harness import dramatiq_defaults, make_env, pika_url

#: Dramatiq's queue for an actor declared without ``queue_name``, and its dead-letter queues.
DEFAULT = ("default", "default.DQ", "default.XQ")


def _ready(connection: Any, name: str) -> int | None:
    """Messages ready in queue ``name``; ``None`` when there is no such queue."""
    channel = connection.channel()
    try:
        return int(channel.queue_declare(name, passive=True).method.message_count)
    except ChannelClosedByBroker as exc:
        if exc.reply_code != 404:
            raise
        return None
    finally:
        if channel.is_open:
            channel.close()


def _dlq(*args: str) -> Result:
    return CliRunner().invoke(main, ["dlq", *args])


@pytest.fixture
def default_dead_letter(redis_url: str, amqp_url: str) -> Iterator[tuple[str, str]]:
    """One dead letter in ``default.XQ``, put there by a real worker: (message id, actor name).

    The actor's name is unique (other code may use ``default`` too); afterwards its
    dead letter is deleted, and the ``default`` queues too if this test created them.
    """
    import redis
    from dramatiq.brokers.rabbitmq import RabbitmqBroker
    from dramatiq.results import Results
    from dramatiq.results.backends import RedisBackend

    token = uuid.uuid4().hex[:8]
    # Dramatiq's default setup (no max_priority: ``default`` may exist without it); job
    # records in Results on Redis, as a worker fleet keeps them.
    broker = RabbitmqBroker(url=pika_url(amqp_url), middleware=dramatiq_defaults())
    broker.add_middleware(Results(backend=RedisBackend(  # type: ignore[no-untyped-call]
        url=redis_url, namespace=f"ojs-test-{token}", use_namespace_prefix_keys=True)))
    broker.add_middleware(OjsRetries())
    client = redis.Redis.from_url(redis_url)
    connection = pika.BlockingConnection(broker.parameters)
    existed = {name: _ready(connection, name) is not None for name in DEFAULT}
    if _ready(connection, "default"):
        connection.close()
        broker.close()
        pytest.skip("queue 'default' holds someone else's messages; a worker here would take them")

    def fail() -> None:
        raise JobError("net.Timeout", "no route to the payment service")

    name = f"ojs_discovery_{token}"
    message = dramatiq.actor(broker=broker, actor_name=name, retry_policy=POLICY)(fail).send()
    worker = dramatiq.Worker(broker, queues={"default"}, worker_timeout=50, worker_threads=1)
    try:
        with quiet():
            worker.start()
            try:
                wait_for(lambda: getattr(get_job_record(message.message_id, broker=broker),
                                         "dead_lettered", False), "the job to be dead-lettered")
            finally:
                worker.stop(timeout=5000)  # the dead delivery is in default.XQ once it stops
        yield message.message_id, name
    finally:
        from dramatiq_ext.dlq import dead_letter_queue

        dlq = dead_letter_queue(broker, queues=["default"])
        dlq.delete([x.id for x in dlq.list(per_page=10_000).items if x.task_type == name])
        dlq.close()
        channel = connection.channel()
        for queue in DEFAULT:
            if not existed[queue]:
                try:
                    channel.queue_delete(queue, if_empty=True)  # left alone if others use it
                except ChannelClosedByBroker:
                    channel = connection.channel()
        connection.close()
        keys = list(client.scan_iter(match=f"ojs-test-{token}*", count=500))
        if keys:
            client.delete(*keys)
        broker.close()


@pytest.mark.broker
def test_list_without_queue_finds_the_dead_letter_in_default_xq(
        default_dead_letter: tuple[str, str], amqp_url: str) -> None:
    """Issue 16 item 6, "Done when": ``dlq list --broker amqp://...`` sees ``default.XQ``."""
    message_id, actor_name = default_dead_letter
    connection = ["--framework", "dramatiq", "--broker", pika_url(amqp_url)]
    listed = _dlq("list", *connection, "--json", "--per-page", "10000")
    assert listed.exit_code == 0, listed.output
    found = json.loads(listed.stdout)
    mine = [x for x in found["items"] if x["task_type"] == actor_name]
    assert [(x["id"], x["queue"], x["error_type"]) for x in mine] == [
        (message_id, "default", "net.Timeout")]
    assert "default.XQ" in found["coverage"]["looked_in"]

    table = _dlq("list", *connection, "--task-type", actor_name)
    assert table.exit_code == 0, table.output
    assert "1 dead letter" in table.stdout and message_id in table.stdout
    if not found["coverage"]["complete"]:  # no management API: it says where it looked
        assert "looked in: default.XQ" in table.stderr and "--queue NAME" in table.stderr

    shown = _dlq("show", message_id, *connection, "--json")
    assert shown.exit_code == 0 and json.loads(shown.stdout)["task_type"] == actor_name


@pytest.fixture
def unique_dead_letter(redis_url: str, amqp_url: str) -> Iterator[tuple[str, str]]:
    """One dead letter on a queue of this test's own: (queue, message id)."""
    with quiet(), make_env("rabbitmq", redis_url=redis_url, amqp_url=amqp_url) as env:
        def fail() -> None:
            raise JobError("net.Timeout", "down")

        message = env.actor(fail, retry_policy=POLICY).send()
        env.start()
        assert len(env.dead_letters(expect=1)) == 1  # taken off to count: put it back
        env.broker.enqueue(message.copy(queue_name=f"{env.queue}.XQ"))
        yield env.queue, message.message_id


@pytest.mark.broker
def test_a_partial_look_says_where_it_looked_and_never_a_silent_zero(
        unique_dead_letter: tuple[str, str], amqp_url: str) -> None:
    queue, message_id = unique_dead_letter
    connection = ["--framework", "dramatiq", "--broker", pika_url(amqp_url),
                  "--option", "management=none", "--task-type", "fail_*"]
    blind = _dlq("list", *connection, "--json")
    assert blind.exit_code == 0, blind.output
    coverage = json.loads(blind.stdout)["coverage"]
    assert coverage["complete"] is False and f"{queue}.XQ" not in coverage["looked_in"]
    assert "default.XQ" in coverage["looked_in"]
    assert ("note: not every dead-letter queue may have been seen; looked in: default.XQ "
            "(RabbitMQ cannot list queues over AMQP); pass --queue NAME or --app MODULE to "
            "look elsewhere") in blind.stderr
    for verb in (("purge", "--yes"), ("prune",)):
        assert "looked in: default.XQ" in _dlq(*verb, *connection[:-2]).stderr

    named = _dlq("list", *connection, "--queue", queue, "--json")
    assert [x["id"] for x in json.loads(named.stdout)["items"]] == [message_id]
    assert json.loads(named.stdout)["coverage"] is None and "note:" not in named.stderr
    missing = _dlq("show", "no-such-job", *connection[:-2])
    assert missing.exit_code == 1 and "looked in: default.XQ" in missing.stderr


@pytest.mark.broker
def test_the_management_api_lists_every_dead_letter_queue(
        unique_dead_letter: tuple[str, str], amqp_url: str) -> None:
    queue, message_id = unique_dead_letter
    api = FakeManagement([queue, f"{queue}.DQ", f"{queue}.XQ", "elsewhere"])
    try:
        listed = _dlq("list", "--framework", "dramatiq", "--broker", pika_url(amqp_url),
                      "--option", f"management={api.url}", "--json")
    finally:
        api.close()
    assert listed.exit_code == 0, listed.output
    found = json.loads(listed.stdout)
    assert [x["id"] for x in found["items"]] == [message_id]
    assert found["coverage"]["complete"] is True and "note:" not in listed.stderr
    assert found["coverage"]["looked_in"] == [f"{queue}.XQ"]
    assert api.requests[0][0] == "/api/queues/%2F?columns=name"


def _ojs_retry(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The installed ``ojs-retry`` script, run in ``cwd`` as a user would (no PYTHONPATH)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    script = Path(sys.executable).parent / "ojs-retry"
    return subprocess.run([str(script), "dlq", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=60, check=False)


@pytest.mark.broker
def test_app_is_imported_from_its_own_folder_like_celery_a(tmp_path: Path, amqp_url: str) -> None:
    """``--app app:app`` (and ``--app app``) work in the app's folder, as ``celery -A app`` does."""
    token = uuid.uuid4().hex[:8]
    (tmp_path / "app.py").write_text(
        "from celery import Celery\n"
        f"app = Celery('ojs_cwd_{token}', broker={amqp_url!r})\n"
        f"app.conf.task_default_queue = 'ojs_cwd_{token}'\n")
    (tmp_path / "brokerapp.py").write_text(
        "import dramatiq\n"
        "from dramatiq.brokers.rabbitmq import RabbitmqBroker\n"
        f"broker = RabbitmqBroker(url={pika_url(amqp_url)!r})\n"
        f"@dramatiq.actor(broker=broker, queue_name='ojs_cwd_{token}')\n"
        "def job() -> None: ...\n")
    for framework, app, dead in (("celery", "app:app", f"ojs_cwd_{token}.dead_letter"),
                                 ("celery", "app", f"ojs_cwd_{token}.dead_letter"),
                                 ("dramatiq", "brokerapp", f"ojs_cwd_{token}.XQ")):
        run = _ojs_retry(tmp_path, "list", "--framework", framework, "--app", app, "--json")
        assert run.returncode == 0, f"--app {app}: {run.stderr}"
        assert dead in json.loads(run.stdout)["coverage"]["looked_in"]
    bad = _ojs_retry(tmp_path, "list", "--framework", "celery", "--app", "nosuchapp")
    assert bad.returncode == 1 and "No module named 'nosuchapp'" in bad.stderr
    # the module is there, the name in it is not (Celery's own words: "No module 'app:nope'")
    bad = _ojs_retry(tmp_path, "list", "--framework", "celery", "--app", "app:nope")
    assert bad.returncode == 1 and "module 'app' has no attribute 'nope'" in bad.stderr


def test_app_from_the_wrong_folder_says_where_to_run_from(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """``--app app`` run elsewhere than app.py's folder: Python's message and where to run it.
    Only for the module --app names: a module the app imports keeps Python's message."""
    token = uuid.uuid4().hex[:8]
    app, deps = f"app_{token}", f"deps_{token}"
    (tmp_path / f"{app}.py").write_text(
        "from celery import Celery\n"
        f"app = Celery('{app}', broker='memory://', set_as_current=False)\n")
    (tmp_path / f"{deps}.py").write_text(f"import missing_dep_{token}\n")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")

    def listed(framework: str, spec: str) -> Result:
        return CliRunner().invoke(main, ["dlq", "list", "--framework", framework, "--app", spec])

    for framework, spec in (("celery", app), ("celery", f"{app}:app"), ("dramatiq", app),
                            ("dramatiq", f"{app}:broker")):
        result = listed(framework, spec)
        assert result.exit_code == 1, result.output
        assert f"Error: No module named '{app}': run it from the folder that holds {app}.py, " \
               "or put that folder on PYTHONPATH" in result.output, (framework, spec)
    for framework in ("celery", "dramatiq"):
        result = listed(framework, f"pkg_{token}.tasks:app")
        assert f"No module named 'pkg_{token}': run it from the folder that holds " \
               f"pkg_{token}/, or put" in result.output
    result = listed("celery", f"{app}.app")  # celery -A's module.attribute form
    assert f"run it from the folder that holds {app}.py or {app}/, or put" in result.output
    monkeypatch.chdir(tmp_path)  # the right folder: what is missing is not the app
    for framework in ("celery", "dramatiq"):
        result = listed(framework, f"{deps}:app")
        assert f"No module named 'missing_dep_{token}'" in result.output
        assert "run it from" not in result.output
        result = listed(framework, f"{app}.sub:app")
        assert f"No module named '{app}.sub'" in result.output
        assert "run it from" not in result.output


def test_celery_by_broker_url_alone_refuses_to_replay_without_the_records() -> None:
    """A bare app's result backend is not the workers': a replay would be dropped as a duplicate."""
    app = Celery("bare", broker="memory://", set_as_current=False)
    letter = DeadLetter(id="j1", queue="celery", task_type="t", error_type="E",
                        dead_lettered_at=datetime.now(timezone.utc), attempt=1)
    with pytest.raises(OjsValidationError, match="--option backend=URL") as caught:
        JobRecords(app, reachable=False).mark(
            letter, ReplayMark.next_for(letter, now=datetime.now(timezone.utc)))
    assert caught.value.code == "INVALID_ARGS" and caught.value.details["field"] == "app"


def test_dramatiq_without_the_workers_records_refuses_to_replay() -> None:
    from dramatiq.brokers.stub import StubBroker

    from dramatiq_ext.dlq import JobRecords as DramatiqRecords

    records = DramatiqRecords(StubBroker())
    records.reachable = False  # as for a RabbitMQ URL without Results
    letter = DeadLetter(id="j1", queue="q", task_type="t", error_type="E",
                        dead_lettered_at=datetime.now(timezone.utc), attempt=1)
    with pytest.raises(OjsValidationError, match="--option records=REDIS_URL") as caught:
        records.mark(letter, ReplayMark.next_for(letter, now=datetime.now(timezone.utc)))
    assert caught.value.code == "INVALID_ARGS" and caught.value.details["field"] == "app"


def test_cli_replay_without_the_records_says_so_in_plain_words() -> None:
    """``dlq replay ID --broker URL`` (no --app): the message, not ``RuntimeError: ...``."""
    sender = Celery("bare-sender", broker="memory://", set_as_current=False)
    queue = f"ojs_plain_{uuid.uuid4().hex[:8]}"
    sent = sender.send_task("t.job", (1,), queue=f"{queue}.dead_letter")
    result = CliRunner().invoke(main, ["dlq", "replay", sent.id, "--queue", queue,
                                       "--framework", "celery", "--broker", "memory://"])
    assert result.exit_code == 1, result.output
    assert result.output.startswith("Error: replay needs the workers' job records: pass --app")
    assert "RuntimeError" not in result.output and "Traceback" not in result.output


@pytest.mark.broker
def test_celery_looks_in_the_default_queue_and_what_the_management_api_lists(
        amqp_url: str) -> None:
    """Celery by URL alone looks in ``celery.dead_letter``; the API adds every other one."""
    from celery_ext.dlq import dead_letter_queue, open_dead_letter_queue

    token = uuid.uuid4().hex[:8]
    bare = open_dead_letter_queue(broker=amqp_url, options={"management": "none"})
    try:
        coverage = bare.coverage()  # names only: no queue is read
    finally:
        bare.close()
    assert coverage.looked_in == ("celery.dead_letter",) and not coverage.complete

    app = Celery(f"ojs_api_{token}", broker=amqp_url, set_as_current=False)
    app.conf.task_default_queue = f"ojs_api_{token}"
    api = FakeManagement([f"ojs_api_{token}", f"ojs_other_{token}.dead_letter", "celery_x"])
    dlq = dead_letter_queue(app, discover=True, management=api.url)
    try:
        assert dlq.queues() == [f"ojs_api_{token}", f"ojs_other_{token}"]
        assert dlq.coverage().complete and dlq.coverage().looked_in == (
            f"ojs_api_{token}.dead_letter", f"ojs_other_{token}.dead_letter")
    finally:
        dlq.close()
        api.close()


@pytest.mark.broker
def test_a_url_ending_in_two_slashes_is_vhost_slash_as_kombu_reads_it(
        unique_dead_letter: tuple[str, str], amqp_url: str) -> None:
    """``amqp://guest:guest@host:5672//``, as kombu and Celery users write vhost ``/``,
    finds the dead letter there; pika read ``//`` as vhost ``""``, which RabbitMQ refuses."""
    queue, message_id = unique_dead_letter
    spelled = pika_url(amqp_url)
    if not spelled.endswith("/%2F"):
        pytest.skip("the test RabbitMQ is not on vhost '/'")
    kombu_url = spelled[:-len("/%2F")] + "//"
    listed = _dlq("list", "--framework", "dramatiq", "--broker", kombu_url, "--option",
                  "management=none", "--queue", queue, "--json")
    assert listed.exit_code == 0, listed.output
    assert [x["id"] for x in json.loads(listed.stdout)["items"]] == [message_id]
