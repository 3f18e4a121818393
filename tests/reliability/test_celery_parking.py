"""RET-11 on both brokers: a long retry waits on the broker, not in a worker (``_parking``).

A real prefork worker subprocess (``celery_parking_app``, parking threshold 1 s)
runs a job whose attempts fail with a 3.5 s retry delay. Each retry must be
parked, on RabbitMQ in the delay levels (``<prefix>_celery_delayed_<n>``, our
own prefix per run) and on Redis in the sorted set ``_ojs.parked``, while the
worker holds nothing: it receives the retry only about a second before it is
due. Each attempt then runs exactly once, not before its delay, and the record
keeps the exact countdowns. A parked retry also survives its worker: SIGKILLed
while the retry is parked and started again after it fell due, a new worker
runs attempt 2 once.

The last two tests drive ``_parking`` without a worker: priority, headers and
the queue survive the RabbitMQ levels, and a park into a deleted level is
returned as an error (mandatory publish), not dropped, and succeeds once the
levels are declared again; two Redis movers racing move every due entry exactly
once, as kombu's ``_put`` would have pushed it, and nothing early.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from kombu import Exchange, Queue
from kombu.transport.native_delayed_delivery import MAX_LEVEL, level_name

from celery_ext import get_job_record
from celery_ext._parking import (
    PARKED_KEY,
    Mover,
    delivery_exchange,
    parking_producer,
    restore_delivery_info,
)
from tests.brokers import AMQP_URL, REDIS_URL, require
from tests.celery_ext.support import wait_for
from tests.reliability.celery_parking_app import DELAY

ROOT = Path(__file__).resolve().parents[2]
#: After a job ended: time for a second copy, were there one, to show up.
GRACE = 1.5
#: The worker may receive a parked retry this long before it is due (Redis: the mover's
#: lead of 1 s plus one poll; RabbitMQ: the fraction of a second under whole seconds).
EARLY = 1.5
#: Loose upper bound on how late attempt 2 starts (slow shared CI machines).
LATE = 4.0
pytestmark = [pytest.mark.broker, pytest.mark.slow]


class Worker:
    """One prefork worker subprocess on a fresh queue, and a client app sending to it."""

    def __init__(self, broker: str) -> None:
        self.broker = broker
        self.prefix = f"ojs-test-{uuid.uuid4().hex[:8]}"
        self.queue = f"{self.prefix}-park"
        url = REDIS_URL if broker == "redis" else AMQP_URL
        self.env = {**os.environ, "OJS_TEST_BROKER": url, "OJS_TEST_BACKEND": REDIS_URL,
                    "OJS_TEST_PREFIX": self.prefix, "OJS_TEST_PARK_AFTER": "1",
                    "PYTHONPATH": str(ROOT)}
        self.redis = redis.Redis.from_url(REDIS_URL)
        self.client = Celery("ojs_park", broker=url, backend=REDIS_URL, set_as_current=False)
        keys = {"global_keyprefix": self.prefix + ":"}
        self.client.conf.update(
            broker_transport_options=keys if broker == "redis" else {},
            result_backend_transport_options=keys)
        self.log = Path(tempfile.mkstemp(prefix="ojs-park-worker-", suffix=".log")[1])
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "tests.reliability.celery_parking_app",
                 "worker", "-P", "prefork", "-c", "1", "-Q", self.queue, "-l", "INFO",
                 "-n", f"{self.prefix}-{uuid.uuid4().hex[:4]}@%h", "--without-gossip",
                 "--without-mingle", "--without-heartbeat"],
                cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)
        proc, size = self.proc, self.log.stat().st_size
        wait_for(lambda: b"ready." in self.log.read_bytes()[size:] or proc.poll() is not None,
                 timeout=60)
        assert proc.poll() is None, self.log.read_text()

    def kill(self) -> None:
        """SIGKILL the worker with its pool."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def send(self, failures: int) -> tuple[Any, str]:
        marker = f"{self.prefix}:runs:{uuid.uuid4().hex[:6]}"
        result = self.client.send_task("ojs_park.fails", (marker, failures), queue=self.queue)
        return result, marker

    def runs(self, marker: str) -> list[dict[str, Any]]:
        return [json.loads(r) for r in self.redis.lrange(marker, 0, -1)]

    def received(self, task_id: str) -> list[dict[str, Any]]:
        key = f"{self.prefix}:received:{task_id}"
        return [json.loads(r) for r in self.redis.lrange(key, 0, -1)]

    def parked(self) -> int:
        """Messages waiting in this run's parking place on the broker."""
        if self.broker == "redis":
            return int(self.redis.zcard(f"{self.prefix}:{PARKED_KEY}"))
        with self.client.connection_for_write() as conn:
            channel = conn.default_channel
            try:
                return sum(channel.queue_declare(level_name(n, self.prefix), passive=True)
                           .message_count for n in range(MAX_LEVEL + 1))
            except conn.channel_errors:  # not declared yet: the first park declares them
                return 0

    def waiting(self) -> int:
        """Messages on the live queue (ready) and, on Redis, delivered but unacked."""
        if self.broker == "redis":
            return int(self.redis.llen(f"{self.prefix}:{self.queue}")
                       + self.redis.hlen(f"{self.prefix}:unacked"))
        with self.client.connection_for_write() as conn:
            return int(conn.default_channel.queue_declare(self.queue, passive=True)
                       .message_count)

    def stop(self) -> None:
        self.kill()
        if self.broker == "amqp":
            _delete_levels(self.client, self.prefix, extra=[self.queue])
        for key in self.redis.scan_iter(match=f"{self.prefix}:*", count=500):
            self.redis.delete(key)
        if os.environ.get("OJS_TEST_SHOW_LOGS"):
            print(self.log.read_text())
        self.log.unlink(missing_ok=True)


def _delete_levels(app: Celery, prefix: str, *, extra: Sequence[str] = ()) -> None:
    """Delete this run's delay levels, delivery exchange and ``extra`` queues/exchanges."""
    with app.connection_for_write() as conn:
        channel = conn.channel()
        names = [level_name(n, prefix) for n in range(MAX_LEVEL + 1)]
        for name in [*names, *extra]:
            channel.queue_delete(name)
        for name in [*names, delivery_exchange(prefix), *extra]:
            channel.exchange_delete(name)


@pytest.fixture(scope="module", params=["redis", "amqp"])
def worker(request: pytest.FixtureRequest) -> Iterator[Worker]:
    require("Redis", "127.0.0.1", 6379)
    if request.param == "amqp":
        require("RabbitMQ", "127.0.0.1", 5672)
    harness = Worker(request.param)
    try:
        harness.start()
        yield harness
    finally:
        harness.stop()


def _send_and_park(worker: Worker, failures: int) -> tuple[Any, str]:
    """Send a job failing ``failures`` times; return once its first retry is parked."""
    result, marker = worker.send(failures)
    wait_for(lambda: worker.runs(marker), timeout=20)
    wait_for(lambda: worker.parked() == 1, timeout=DELAY - 1)
    return result, marker


def _check_ran_once(worker: Worker, result: Any, marker: str, *, failures: int,
                    late: float = LATE) -> list[dict[str, Any]]:
    """Each attempt ran once, each retry not before its delay (RET-11); the runs."""
    try:
        assert result.get(timeout=30, interval=0.05) == "ok"
    except BaseException:
        print(worker.log.read_text()[-6000:])
        raise
    time.sleep(GRACE)
    runs = sorted(worker.runs(marker), key=lambda r: int(r["attempt"]))
    assert Counter(r["attempt"] for r in runs) == {a: 1 for a in range(1, failures + 2)}, runs
    for before, after in itertools.pairwise(runs):
        assert DELAY <= after["at"] - before["at"] < DELAY + late  # RET-11
    record = get_job_record(result.id, app=worker.client)
    assert record is not None
    assert (record.state, record.attempt, record.queue) == (
        "completed", failures + 1, worker.queue)  # the queue, not the delay exchange
    assert record.extra["countdowns"] == [DELAY] * failures  # decide's exact countdowns
    assert [(e.attempt, e.code) for e in record.errors] == [
        (a, "HANDLER_ERROR") for a in range(1, failures + 1)]
    assert worker.parked() == 0
    return runs


def test_ret11_long_retries_wait_on_the_broker_and_run_once_on_time(worker: Worker) -> None:
    """Two 3.5 s retries in a row, both parked: the second passes the same RabbitMQ levels
    as the first (kept ``x-death`` headers would make it a dead-letter cycle: dropped)."""
    result, marker = _send_and_park(worker, failures=2)
    # Parked: not on the live queue, not held (unacked) by the worker, not received.
    wait_for(lambda: worker.waiting() == 0, timeout=2)  # attempt 1's delivery is acked
    assert worker.parked() == 1
    assert len(worker.received(result.id)) == 1  # attempt 1's delivery only
    runs = _check_ran_once(worker, result, marker, failures=2)
    received = worker.received(result.id)
    assert len(received) == 3, received
    for failed, retry in zip(runs[:-1], received[1:], strict=True):
        assert retry["at"] >= failed["at"] + DELAY - EARLY  # held about a second, no more
        assert retry["eta"]  # the ETA (the exact not_before) came back with it


def test_ret11_parked_retry_survives_a_worker_killed_and_restarted(worker: Worker) -> None:
    result, marker = _send_and_park(worker, failures=1)
    [first] = worker.runs(marker)
    wait_for(lambda: worker.waiting() == 0, timeout=5)  # the original is acked
    worker.kill()
    time.sleep(max(0.0, first["at"] + DELAY + 0.5 - time.time()))  # due, and no worker
    if worker.broker == "redis":
        assert worker.parked() == 1  # nobody moved it: still parked, not lost
    else:
        wait_for(lambda: worker.waiting() == 1, timeout=5)  # the broker delivered it
    worker.start()
    _check_ran_once(worker, result, marker, failures=1, late=LATE + 60)  # waited for a worker


# -- without a worker ---------------------------------------------------------------


def test_amqp_parked_message_keeps_priority_headers_and_queue() -> None:
    require("RabbitMQ", "127.0.0.1", 5672)
    prefix = f"ojs-test-{uuid.uuid4().hex[:8]}"
    queue = f"{prefix}-q.high"  # a dotted name: matched exactly, word for word
    app = Celery("ojs_park_unit", broker=AMQP_URL, set_as_current=False)
    app.conf.update(ojs_park_after=1, ojs_park_prefix=prefix, task_default_queue=queue)
    try:
        with app.connection_for_write(transport_options={"confirm_publish": True}) as conn:
            live = Queue(queue, Exchange(queue, type="direct"), queue, max_priority=9)
            live.bind(conn.default_channel).declare()

            def park() -> None:
                producer = parking_producer(app, conn, queue=queue,
                                            not_before=time.time() + 1.5)
                assert producer is not None
                producer.publish({"x": 1}, exchange=queue, routing_key=queue, priority=7,
                                 headers={"ojs": "{}"}, delivery_mode=2)

            assert parking_producer(app, conn, queue=queue, not_before=time.time() + 9)
            conn.channel().queue_delete(level_name(0, prefix))  # 1 s parks wait there
            with pytest.raises(conn.channel_errors):  # unroutable: returned, not dropped
                park()
            conn.collect()  # the channel closed after the return: a fresh one
            start = time.time()
            park()  # the levels are declared again
            simple = conn.SimpleQueue(live, no_ack=True)
            try:
                message = simple.get(timeout=10)
            finally:
                simple.close()
            assert 1.0 <= time.time() - start < 5.0  # one whole second of park
            assert message.payload == {"x": 1}
            assert message.properties["priority"] == 7
            assert message.headers["ojs"] == "{}"
            restore_delivery_info(message, app)
            assert (message.delivery_info["exchange"],
                    message.delivery_info["routing_key"]) == ("", queue)
    finally:
        _delete_levels(app, prefix, extra=[queue])


def test_redis_movers_racing_move_each_due_entry_once_as_put_would() -> None:
    require("Redis", "127.0.0.1", 6379)
    prefix = f"ojs-test-{uuid.uuid4().hex[:8]}:"
    app = Celery("ojs_park_unit", broker=REDIS_URL, set_as_current=False)
    app.conf.update(broker_transport_options={"global_keyprefix": prefix}, ojs_park_after=1,
                    task_default_queue="q")
    client = redis.Redis.from_url(REDIS_URL)
    try:
        with app.connection_for_write() as conn:
            now = time.time()
            for i in range(200):  # due in publish order, 1 ms apart
                producer = parking_producer(app, conn, queue="q", not_before=now + 2 + i / 1000)
                assert producer is not None
                producer.publish({"i": i}, routing_key="q", priority=9 if i % 2 else 0)
            later = parking_producer(app, conn, queue="q", not_before=now + 60)
            assert later is not None
            later.publish({"i": "later"}, routing_key="q")
            assert client.zcard(f"{prefix}{PARKED_KEY}") == 201
            movers = [Mover(app, interval=0.1) for _ in range(2)]
            assert movers[0].move_due(now) == 0  # nothing is due yet (lead: 1 s)
            threads = [threading.Thread(target=m.move_due, args=(now + 1.3,)) for m in movers]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert client.zcard(f"{prefix}{PARKED_KEY}") == 1  # the later one waits
            channel = conn.default_channel
            keys = {channel._q_for_pri("q", 0), channel._q_for_pri("q", 9)}
            assert {client.llen(prefix + k) for k in keys} == {100}  # priority lists, as _put
            simple = conn.SimpleQueue("q", no_ack=True)
            try:
                got = [simple.get(timeout=2).payload["i"] for _ in range(200)]
            finally:
                simple.close()
            assert sorted(got) == list(range(200))  # each once
            for parity in (0, 1):  # in due order within each priority
                assert [i for i in got if i % 2 == parity] == list(range(parity, 200, 2))
            for mover in movers:
                mover.stop()
    finally:
        for key in client.scan_iter(match=f"{prefix}*", count=500):
            client.delete(key)
