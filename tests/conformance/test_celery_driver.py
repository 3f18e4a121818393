"""The Celery conformance driver on each broker: refusal at enqueue, dead letters, cleanup.

The suite itself proves the scenarios; these tests prove what it takes for granted
of the driver: a refused policy never reaches the broker, the dead-letter set is
read from the ``<queue>.dead_letter`` queue (and reading it twice finds the same),
and ``stop()`` leaves no worker process, Redis key or queue of the run behind.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from conformance.drivers._celery_app import RECORD_REDIS_URL
from conformance.drivers.celery_driver import CeleryDriver
from conformance.scenarios import Scenario, load_scenarios
from conformance.script import AttemptLog
from ojs_adapters import OjsValidationError
from tests.conformance.support import wait_terminal

SCENARIOS = {s.id: s for s in load_scenarios()}


def test_capabilities_name_the_broker(tmp_path: Path) -> None:
    assert CeleryDriver("memory", tmp_path).capabilities == frozenset()
    assert CeleryDriver("amqp://guest:guest@127.0.0.1:5672//", tmp_path).capabilities == {
        "time_limit", "crash"}
    with pytest.raises(ValueError, match="redis"):
        CeleryDriver("sqs://queue", tmp_path)
    with pytest.raises(ValueError, match="crash"):
        CeleryDriver("memory", tmp_path).start((SCENARIOS["repeated-crash-ends-the-job"],))


def test_ret16_refused_policy_raises_and_nothing_runs(broker_url: str, tmp_path: Path) -> None:
    ok = SCENARIOS["max-attempts-one-runs-once"]
    with CeleryDriver(broker_url, tmp_path) as driver:
        driver.start((ok,))
        with pytest.raises(OjsValidationError) as refused:
            driver.submit(SCENARIOS["unknown-field-rejected-at-enqueue"], "refused")
        assert refused.value.code == "INVALID_RETRY_POLICY"
        assert wait_terminal(driver, driver.submit(ok, "after"))["attempt"] == 1
    assert AttemptLog(tmp_path).starts("refused") == []


def test_dead_letters_come_from_the_broker_and_stop_cleans_up(
        broker_url: str, tmp_path: Path) -> None:
    chosen: tuple[Scenario, ...] = (SCENARIOS["handler-dead-letter"], SCENARIOS["handler-fail"])
    driver = CeleryDriver(broker_url, tmp_path)
    if "crash" in driver.capabilities:
        chosen += (SCENARIOS["repeated-crash-ends-the-job"],)
    driver.start(chosen)
    try:
        ids = {s.id: driver.submit(s, s.id) for s in chosen}
        for job_id in ids.values():
            wait_terminal(driver, job_id)
        time.sleep(0.5)  # the worker publishes the dead letter after the record
        dead = driver.dead_lettered_ids()
        assert dead == {ids[s.id] for s in chosen if s.id != "handler-fail"}
        assert driver.dead_lettered_ids() == dead  # reading does not consume
        process = driver._proc
    finally:
        driver.stop()
    assert process is None or process.poll() is not None
    queues = [driver.config.queue, driver.dead_letter_queue]
    if broker_url == "memory":
        from kombu.transport.memory import Channel

        assert not set(queues) & set(Channel.queues)
    elif broker_url.startswith("redis"):
        _assert_no_redis_keys(broker_url, driver.config.prefix)
    else:
        _assert_no_redis_keys(RECORD_REDIS_URL, driver.config.prefix)
        _assert_no_queues(broker_url, queues)


def _assert_no_redis_keys(url: str, prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    try:
        assert list(client.scan_iter(match=f"{prefix}:*")) == []
    finally:
        client.close()


def _assert_no_queues(url: str, queues: list[str]) -> None:
    from kombu.connection import Connection

    with Connection(url) as conn:  # type: ignore[no-untyped-call]
        for name in queues:
            channel = conn.channel()
            with pytest.raises(conn.channel_errors):
                channel.queue_declare(name, passive=True)
