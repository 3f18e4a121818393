"""The Dramatiq conformance driver on each broker: refusal at enqueue, dead letters, cleanup.

The suite itself proves the scenarios; these tests prove what it takes for granted
of the driver: a refused policy never reaches the broker, the dead-letter set is
read from the ``.XQ`` queues (and reading it twice finds the same), and ``stop()``
leaves no worker process, Redis key or RabbitMQ queue of the run behind.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from conformance.drivers._dramatiq_setup import RECORD_REDIS_URL, pika_url
from conformance.drivers.dramatiq_driver import DramatiqDriver
from conformance.scenarios import Scenario, load_scenarios
from conformance.script import AttemptLog
from ojs_adapters import OjsValidationError
from ojs_adapters.runtime.leases import LEASE_SECONDS
from tests.conformance.support import wait_terminal

SCENARIOS = {s.id: s for s in load_scenarios()}


def test_capabilities_name_the_broker(tmp_path: Path) -> None:
    assert DramatiqDriver("memory", tmp_path).capabilities == {"time_limit"}
    assert DramatiqDriver("redis://127.0.0.1:6379/0", tmp_path).capabilities == {
        "time_limit", "crash"}
    with pytest.raises(ValueError, match="redis"):
        DramatiqDriver("sqs://queue", tmp_path)


def test_a_crash_scenario_is_refused_where_no_process_can_die(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="worker process"):
        DramatiqDriver("memory", tmp_path).start((SCENARIOS["repeated-crash-ends-the-job"],))


def test_ret16_refused_policy_raises_and_nothing_runs(broker_url: str, tmp_path: Path) -> None:
    ok = SCENARIOS["max-attempts-one-runs-once"]
    with DramatiqDriver(broker_url, tmp_path) as driver:
        driver.start((ok,))
        with pytest.raises(OjsValidationError) as refused:
            driver.submit(SCENARIOS["unknown-field-rejected-at-enqueue"], "refused")
        assert refused.value.code == "INVALID_RETRY_POLICY"
        wait_terminal(driver, driver.submit(ok, "after"))  # the queue moved on
    assert AttemptLog(tmp_path).starts("refused") == []


def test_dead_letters_come_from_the_broker_and_stop_cleans_up(
        broker_url: str, tmp_path: Path) -> None:
    chosen: tuple[Scenario, ...] = (SCENARIOS["handler-dead-letter"], SCENARIOS["handler-fail"])
    driver = DramatiqDriver(broker_url, tmp_path)
    if "crash" in driver.capabilities:
        chosen += (SCENARIOS["repeated-crash-ends-the-job"],)
    driver.start(chosen)
    try:
        ids = {s.id: driver.submit(s, s.id) for s in chosen}
        for job_id in ids.values():
            # Three crashes, each counted once the dead worker's lease lapses (LEASE_SECONDS
            # each): 20 s was the whole budget of that job, and one CI run missed it by a hair.
            wait_terminal(driver, job_id, timeout=20.0 + 3 * LEASE_SECONDS)
        time.sleep(0.5)  # the hop to the .XQ queue follows the record
        dead = driver.dead_lettered_ids()
        assert dead == {ids[s.id] for s in chosen if s.id != "handler-fail"}
        assert driver.dead_lettered_ids() == dead  # reading does not consume
        processes = [w.proc for w in driver._crash_workers]
    finally:
        driver.stop()
    assert all(p is not None and p.poll() is not None for p in processes)
    namespace, queues = driver.config.namespace, driver.queues
    if broker_url.startswith("redis"):
        _assert_no_redis_keys(broker_url, namespace)
    elif broker_url.startswith("amqp"):
        _assert_no_redis_keys(RECORD_REDIS_URL, namespace)
        _assert_no_queues(broker_url, queues)


def _assert_no_redis_keys(url: str, namespace: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    try:
        assert list(client.scan_iter(match=f"{namespace}:*")) == []
    finally:
        client.close()


def _assert_no_queues(url: str, queues: list[str]) -> None:
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(pika_url(url)))
    try:
        for queue in queues:
            for name in (queue, f"{queue}.DQ", f"{queue}.XQ"):
                channel = connection.channel()
                with pytest.raises(pika.exceptions.ChannelClosedByBroker):
                    channel.queue_declare(name, passive=True)
    finally:
        connection.close()
