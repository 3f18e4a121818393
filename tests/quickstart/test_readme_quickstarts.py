"""The README's quick starts, run as written: ``celery -A app worker`` and ``dramatiq app``.

Each test saves the README's ``app.py`` in an empty folder, starts the framework's own
worker command there, and runs the README's sender snippet beside it, with only the
packages of the extra the README names for that setup importable (issue 16: the first
commands a newcomer types must work). The RabbitMQ variants change only the broker
line, and check the dead letter on the queue itself (no Redis there to hold records).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

import pika
import pika.exceptions
import pytest
import redis

from tests.quickstart.support import ROOT, Worker, environment, readme_block, run_script

pytestmark = [pytest.mark.broker, pytest.mark.slow]

CELERY_WORKER = ["celery", "-A", "app", "worker", "--loglevel=INFO"]
DRAMATIQ_WORKER = ["dramatiq", "app"]
CELERY_READY = "ready."
DRAMATIQ_READY = "Worker process is ready for action."
AMQP = "amqp://guest:guest@127.0.0.1:5672"


def _expected_output(block: str) -> str:
    """The output the README promises: the snippet's last line, a comment."""
    return block.rstrip().splitlines()[-1].removeprefix("# ")


def _readme_mentions(*phrases: str) -> None:
    readme = (ROOT / "README.md").read_text()
    for phrase in phrases:
        assert phrase in readme, f"README.md no longer says {phrase!r}"


def _take_from_queue(queue: str, wanted: str, field: str, timeout: float = 20) -> dict[str, object]:
    """Consume from RabbitMQ ``queue`` the message whose ``field`` is ``wanted``; others stay."""
    connection = pika.BlockingConnection(pika.URLParameters(AMQP))
    channel = connection.channel()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                method, properties, body = channel.basic_get(queue)
            except pika.exceptions.ChannelClosedByBroker:  # 404: not declared yet
                channel = connection.channel()
                time.sleep(0.2)
                continue
            if method is None:
                time.sleep(0.2)
                continue
            headers = dict(properties.headers or {})
            payload = json.loads(body) if field == "message_id" else {}
            value = payload.get(field) if payload else headers.get(field)
            if value == wanted:
                channel.basic_ack(method.delivery_tag)
                return {"headers": headers, "body": payload}
            # Others' messages stay unacked (so the next get moves on) until the close
            # hands them back to the queue.
    finally:
        connection.close()
    raise AssertionError(f"no message with {field}={wanted!r} on {queue} in {timeout}s")


def _delete_if_empty(*queues: str) -> None:
    """Drop the quick start's queues again, so other tests may declare them their own way."""
    connection = pika.BlockingConnection(pika.URLParameters(AMQP))
    try:
        for queue in queues:
            # Not empty (someone else's messages) or already gone: left as it is.
            with contextlib.suppress(pika.exceptions.ChannelClosedByBroker):
                connection.channel().queue_delete(queue, if_empty=True)
    finally:
        connection.close()


def _only_the_job_s_tracebacks(output: str) -> None:
    """Each traceback in a Celery worker's log is the README job's own last failure (logged
    at ERROR with its traceback, as Celery logs any failure), none of ours."""
    assert output.count("] raised unexpected: ") == 1, output  # the dead-lettering attempt's
    for block in output.split("Traceback (most recent call last):")[1:]:
        raised = next(line for line in block.splitlines() if line and not line[0].isspace())
        assert "insufficient funds" in raised, output  # the JobError, or ours carrying it


def test_celery_quickstart_as_written(tmp_path: Path, redis_url: str) -> None:
    """``celery -A app worker`` runs the README's app; the sender reads a dead-lettered record."""
    _readme_mentions("`celery -A app worker --loglevel=INFO`", "ojs-adapters[celery-redis]")
    (tmp_path / "app.py").write_text(readme_block("quickstart-celery-app"))
    send = readme_block("quickstart-celery-send")
    worker = Worker(CELERY_WORKER, tmp_path, "celery-redis", CELERY_READY)
    try:
        out = run_script(tmp_path, send + "print(result.id)\n", "celery-redis").splitlines()
    finally:
        worker.stop()
    assert out[0] == _expected_output(send), worker.output
    assert "ojs-adapters:" not in worker.output  # task_cls=OjsTask: nothing to warn about
    _only_the_job_s_tracebacks(worker.output)
    redis.Redis.from_url(redis_url).delete("celery.dead_letter")


def test_celery_quickstart_on_rabbitmq_without_redis(tmp_path: Path, amqp_url: str) -> None:
    """``[celery-rabbitmq]`` alone (no redis-py): the worker runs, warns that ``rpc://`` keeps
    no record, and the job still ends on ``celery.dead_letter`` with its history."""
    app = readme_block("quickstart-celery-app").replace(
        'broker="redis://127.0.0.1:6379/0", backend="redis://127.0.0.1:6379/1"',
        f'broker="{AMQP}//", backend="rpc://"')
    assert "rpc://" in app
    (tmp_path / "app.py").write_text(app)
    worker = Worker(CELERY_WORKER, tmp_path, "celery-rabbitmq", CELERY_READY)
    try:
        task_id = run_script(tmp_path, "from app import charge\nprint(charge.delay(7).id)\n",
                             "celery-rabbitmq").strip()
        dead = _take_from_queue("celery.dead_letter", task_id, "id")
    finally:
        worker.stop()
    record = json.loads(str(dead["headers"]["ojs-dead-letter"]))  # type: ignore[index]
    assert (record["outcome"], record["attempt"]) == ("dead_letter", 3)
    assert "stores no job record" in worker.output
    _only_the_job_s_tracebacks(worker.output)  # nothing of ours reaches for redis-py


def test_dramatiq_quickstart_as_written(tmp_path: Path, redis_url: str) -> None:
    """``dramatiq app`` runs the README's app on the broker it sets; the sender reads the record."""
    _readme_mentions("`dramatiq app`", "ojs-adapters[dramatiq-redis]")
    (tmp_path / "app.py").write_text(readme_block("quickstart-dramatiq-app"))
    send = readme_block("quickstart-dramatiq-send")
    worker = Worker(DRAMATIQ_WORKER, tmp_path, "dramatiq-redis", DRAMATIQ_READY)
    try:
        out = run_script(tmp_path, send + "print(message.message_id)\n",
                         "dramatiq-redis").splitlines()
    finally:
        worker.stop()
    assert out[0] == _expected_output(send), worker.output
    ours = [line for line in worker.lines if "OjsRetries]" in line]
    assert not [line for line in ours if "[WARNING]" in line or "[ERROR]" in line], \
        worker.output  # a default setup has nothing to warn about
    assert any("dead-lettered to 'default.XQ' after attempt 3" in line for line in ours)
    client = redis.Redis.from_url(redis_url)
    client.zrem("dramatiq:default.XQ", out[1])
    client.hdel("dramatiq:default.XQ.msgs", out[1])


def test_dramatiq_quickstart_on_rabbitmq_without_redis(tmp_path: Path, amqp_url: str) -> None:
    """``[dramatiq-rabbitmq]`` alone (no redis-py): the job ends on ``default.XQ``."""
    app = readme_block("quickstart-dramatiq-app").replace(
        "from dramatiq.brokers.redis import RedisBroker",
        "from dramatiq.brokers.rabbitmq import RabbitmqBroker").replace(
        'RedisBroker(url="redis://127.0.0.1:6379/0")', f'RabbitmqBroker(url="{AMQP}")')
    assert "RabbitmqBroker(" in app
    (tmp_path / "app.py").write_text(app)
    worker = Worker(DRAMATIQ_WORKER, tmp_path, "dramatiq-rabbitmq", DRAMATIQ_READY)
    try:
        message_id = run_script(tmp_path, "from app import charge\n"
                                          "print(charge.send(7).message_id)\n",
                                "dramatiq-rabbitmq").strip()
        dead = _take_from_queue("default.XQ", message_id, "message_id")
    finally:
        worker.stop()
        _delete_if_empty("default", "default.DQ", "default.XQ")
    assert dead["body"]["actor_name"] == "charge"  # type: ignore[index]
    notices = [line for line in worker.lines if "kept in this process only" in line]
    assert len(notices) >= 1 and "RedisRecordStore" in notices[0], worker.output


def test_testing_snippet_as_written(tmp_path: Path) -> None:
    """The README's ``instant_retries()`` snippet, on the Celery quick start's app, with only
    ``[celery-redis]`` importable: the policy's attempts and countdowns, no broker."""
    (tmp_path / "app.py").write_text(readme_block("quickstart-celery-app"))
    snippet = readme_block("testing-snippet")
    out = run_script(tmp_path, snippet, "celery-redis").splitlines()
    assert out[0] == _expected_output(snippet)


def test_testing_docs_fixture_example_passes_under_pytest(tmp_path: Path) -> None:
    """docs/testing.md's ``ojs_retries`` example, saved as a test file and run by pytest
    (the plugin comes from the installed entry point), with only ``[celery]`` importable."""
    (tmp_path / "test_charge.py").write_text(readme_block("fixture-example", "docs/testing.md"))
    env = environment("celery-redis")
    env["OJS_BLOCK"] = env["OJS_BLOCK"].replace(",pytest", "")  # the user's test runner
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "test_charge.py"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout
