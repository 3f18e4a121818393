"""Issue 11, Celery: the broker link is cut exactly while a retry or a dead letter is published.

A real in-process worker (threads pool) publishes to the shared broker through a
``Proxy`` the test owns (``broker_write_url``; it consumes over ``broker_read_url``,
directly: an in-process Celery worker whose *consumer* link is cut does not always
come back or stop, which is Celery's reconnect, not the hand-off under test). The
result backend (job records, claims) is reached directly. The proxy is cut from
inside the adapter's publish (``confirming_connection``, or ``pooled_producer`` on
Redis), just before it: a short outage on the first retry (the in-place retries ride
it out) and a long one on the first dead letter (the original is requeued, or stays
unacked, and comes back). One retry is also
published twice. Then every job must be completed or dead-lettered exactly once,
and no attempt may run twice. The RabbitMQ test reads the ``x-ojs-*`` headers of
a retried and of a dead-lettered message off the broker.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

import pytest
from celery.contrib.testing.worker import start_worker
from celery.exceptions import Retry

import celery_ext._deadletter as deadletter_module
import celery_ext._retry_send as retry_send_module  # where a retry is published
from celery_ext.records import RecordStore
from ojs_adapters.runtime.backend_retry import FAILURES_REGISTRY
from tests.brokers import AMQP_URL, REDIS_URL
from tests.celery_ext.support import RUNS, Broker, drain, register_tasks, wake_for_shutdown
from tests.handoff.proxy import Proxy

#: Jobs per run: even ones succeed on attempt 2, odd ones are dead-lettered after it.
JOBS = 6
POLICY = {"max_attempts": 2, "on_exhaustion": "dead_letter"}
#: Outage length per hand-off kind, seconds: within, then beyond, the in-place retries.
OUTAGES = {"retry": 0.8, "dead letter": 3.5}


@contextmanager
def _worker(kind: str, proxy: Proxy, after_stop: list[Callable[[], Any]] | None = None,
            ) -> Iterator[tuple[Any, dict[str, Any], str, Broker]]:
    """A worker whose broker traffic goes through ``proxy``; records on the real Redis.

    ``after_stop`` callables run once the worker stopped, before the queues are deleted.
    """
    url = (f"redis://127.0.0.1:{proxy.port}/0" if kind == "redis"
           else f"amqp://guest:guest@127.0.0.1:{proxy.port}//")
    direct = REDIS_URL if kind == "redis" else AMQP_URL
    broker = Broker(kind, direct, REDIS_URL)
    app = broker.make_app(f"ojs-handoff-{kind}")
    app.conf.broker_read_url, app.conf.broker_write_url = direct, url
    if kind == "redis":  # unacked messages of a lost connection come back after this
        app.conf.broker_transport_options = {**broker.transport_options(),
                                             "visibility_timeout": 5}
    app.conf.broker_connection_retry = True
    app.conf.broker_connection_max_retries = None
    tasks = register_tasks(app)
    queue = broker.queue_name("h")
    try:
        with start_worker(app, pool="threads", concurrency=4, perform_ping_check=False,
                          queues=[queue], loglevel="WARNING", shutdown_timeout=30):
            yield app, tasks, queue, broker
            proxy.restore()
            wake_for_shutdown(tasks["scripted"], ["ok"], queue=queue)
        for step in after_stop or ():
            step()
    finally:
        proxy.restore()
        broker.cleanup(app)


@pytest.fixture(params=["redis", "amqp"])
def kind(request: pytest.FixtureRequest, redis_url: str) -> str:
    if request.param == "amqp":
        request.getfixturevalue("amqp_url")
    logging.getLogger("celery.worker.consumer").setLevel(logging.CRITICAL)  # reconnect noise
    return str(request.param)


def _proxy_for(kind: str) -> Proxy:
    return Proxy("127.0.0.1", 6379 if kind == "redis" else 5672)


def _until(probe: Callable[[], Any], *, timeout: float,
           explain: Callable[[], str] = str) -> Any:
    """``probe()`` once it is truthy; past ``timeout``, fail saying ``explain()``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = probe()
        except Exception:  # the link is cut: not yet
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout}s {explain()}")
        time.sleep(0.1)


#: Set in the child process that runs the fault scenario (see the test below).
_CHILD = os.environ.get("OJS_HANDOFF_CHILD") == "1"


@pytest.mark.broker
@pytest.mark.slow
def test_issue11_cut_during_retry_and_dead_letter_publish_loses_nothing(
        kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs in a child process: in-process Celery workers share process-wide state, and
    the session workers of ``tests/celery_ext`` would still be running beside this one."""
    if not _CHILD:
        child = subprocess.run(
            [sys.executable, "-m", "pytest", f"{__file__}::{_this_test()}[{kind}]", "-q", "-s",
             "-p", "no:cacheprovider", "-p", "no:randomly"],
            env={**os.environ, "OJS_HANDOFF_CHILD": "1"}, capture_output=True, text=True,
            timeout=120, check=False)
        print("\n".join(line for line in child.stdout.splitlines()
                        if line.startswith("celery ") or "passed" in line or "failed" in line))
        assert child.returncode == 0, child.stdout[-4000:] + child.stderr[-4000:]
        return
    _scenario(kind, monkeypatch)


def _this_test() -> str:
    return "test_issue11_cut_during_retry_and_dead_letter_publish_loses_nothing"


def _scenario(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = _proxy_for(kind)
    lock = threading.Lock()
    plan, cuts, duplicated = dict(OUTAGES), [], []
    armed = threading.Event()  # set once the test has sent its jobs through the proxy

    def cutting(what: str, real: Callable[[Any], Any]) -> Callable[[Any], Any]:
        @contextmanager
        def connection(app: Any) -> Iterator[Any]:
            with lock:
                if what in plan and proxy.up and armed.is_set():
                    cuts.append(what)
                    proxy.cut_for(plan.pop(what))  # the broker goes away just before the publish
            with real(app) as conn:
                yield conn
        return connection

    real_retry = retry_send_module.Task.retry

    class _Task:  # Task.retry publishing one retry twice (as when an ack is lost), once
        @staticmethod
        def retry(task: Any, *call: Any, **options: Any) -> Any:  # call: args, kwargs
            with lock:
                twice = not duplicated and proxy.up and armed.is_set()
                if twice:
                    duplicated.append(task.request.id)
            if twice:
                with suppress(Retry):
                    real_retry(task, *call, **options)
                options["headers"] = {**options["headers"], "ojs-token": "the-duplicate"}
            return real_retry(task, *call, **options)

    monkeypatch.setattr(retry_send_module, "confirming_connection",
                        cutting("retry", retry_send_module.confirming_connection))
    monkeypatch.setattr(deadletter_module, "confirming_connection",
                        cutting("dead letter", deadletter_module.confirming_connection))
    # A broker without publisher confirms (Redis) publishes through the app's producer pool.
    monkeypatch.setattr(retry_send_module, "pooled_producer",
                        cutting("retry", retry_send_module.pooled_producer))
    monkeypatch.setattr(deadletter_module, "pooled_producer",
                        cutting("dead letter", deadletter_module.pooled_producer))
    monkeypatch.setattr(retry_send_module, "Task", _Task)
    failures_before = sum(v for k, v in FAILURES_REGISTRY.items() if k.startswith("publish"))
    try:
        with _worker(kind, proxy) as (app, tasks, queue, _broker):
            started = time.monotonic()
            # Sent straight to the broker, not through the proxy: a cut would drop jobs the
            # test sent (unconfirmed, still in the proxy) and prove nothing of ours.
            with app.connection_for_read() as direct:  # broker_read_url: no proxy
                producer = direct.Producer()
                results = [tasks["scripted"].apply_async(
                    (["raise:value", "ok" if i % 2 == 0 else "raise:value"],), queue=queue,
                    retry_policy=POLICY, producer=producer) for i in range(JOBS)]
            armed.set()
            # Job records, not result states: Celery writes RETRY after the retry is
            # published, so a fast attempt 2 can finish first and its SUCCESS be overwritten.
            store = RecordStore(app.backend)

            def ended() -> list[Any] | None:
                found = [store.load(r.id) for r in results]
                return found if all(rec is not None and rec.state in ("completed", "discarded")
                                    for rec in found) else None

            def where() -> str:  # what a job that did not end was doing, for a failure
                found = [(store.load(r.id), RUNS[r.id]) for r in results]
                return "; ".join(
                    f"job {i}: {rec and (rec.state, rec.attempt, rec.extra.get('handed_off'))}"
                    f" runs {[run.attempt for run in runs]}"
                    for i, (rec, runs) in enumerate(found))

            records = _until(ended, timeout=40, explain=where)
            dead = _until(lambda: drain(app, f"{queue}.dead_letter", expect=JOBS // 2,
                                        timeout=2), timeout=20)
            time.sleep(1.0)  # a duplicate, were there one, would arrive now
            dead += drain(app, f"{queue}.dead_letter", expect=JOBS, timeout=1)
            elapsed = time.monotonic() - started
    finally:
        proxy.close()

    completed = [i for i, rec in enumerate(records) if rec.outcome == "completed"]
    dead_letter_errors = [i for i, rec in enumerate(records) if rec.dead_lettered]
    dead_ids = Counter(m.headers["id"] for m in dead)
    runs = Counter((i, run.attempt) for i, r in enumerate(results) for run in RUNS[r.id])
    publish_failures = sum(v for k, v in FAILURES_REGISTRY.items()
                           if k.startswith("publish")) - failures_before
    print(f"\ncelery {kind}: {len(completed)} completed, {len(dead_ids)} dead-lettered, "
          f"{sum(runs.values())} runs, cuts={cuts}, duplicate retry of {duplicated}, "
          f"{publish_failures} failed publish tries, {elapsed:.1f}s")
    assert sorted(cuts) == ["dead letter", "retry"]
    assert duplicated and publish_failures >= 1
    assert completed == [i for i in range(JOBS) if i % 2 == 0], "a job did not complete"
    assert dead_letter_errors == [i for i in range(JOBS) if i % 2]
    assert sorted(dead_ids) == sorted(results[i].id for i in range(JOBS) if i % 2)
    assert set(dead_ids.values()) == {1}, "a job was dead-lettered twice"
    assert runs == {(i, a): 1 for i in range(JOBS) for a in (1, 2)}, "an attempt ran twice"


def test_err008_rabbitmq_retry_and_dead_letter_carry_x_ojs_headers(amqp_url: str) -> None:
    """Read the headers off the broker: the waiting retry (after the worker let go of it)
    and the dead letter in ``<queue>.dead_letter``."""
    proxy = _proxy_for("amqp")  # not cut here: the same worker set-up as above
    held: list[Any] = []
    after_stop = [lambda: held.extend(drain(app, queue, expect=1, timeout=10))]
    try:
        with _worker("amqp", proxy, after_stop) as (app, tasks, queue, _broker):
            retried = tasks["scripted"].apply_async(
                (["raise:job:payment.declined"],), queue=queue,
                retry_policy={"max_attempts": 2, "initial_interval": "PT60S",
                              "max_interval": "PT60S"})
            dead = tasks["scripted"].apply_async(
                (["raise:job:payment.declined:DEAD_LETTER"],), queue=queue)
            _until(lambda: RecordStore(app.backend).load(retried.id)
                   .extra.get("handed_off"), timeout=20)
            [dead_message] = drain(app, f"{queue}.dead_letter", expect=1, timeout=20)
        # the worker stopped: the retry it held for its countdown went back to the queue
        [retry_message] = held
    finally:
        proxy.close()
    retry_headers, dead_headers = retry_message.headers, dead_message.headers
    print(f"\nretry x-ojs headers: "
          f"{ {k: v for k, v in retry_headers.items() if k.startswith('x-ojs')} }"
          f"\ndead-letter x-ojs headers: "
          f"{ {k: v for k, v in dead_headers.items() if k.startswith('x-ojs')} }")
    assert retry_headers["id"] == retried.id and dead_headers["id"] == dead.id
    assert retry_headers["x-ojs-error-code"] == "HANDLER_ERROR"
    assert retry_headers["x-ojs-error-message"] == "handler said nothing"
    assert retry_headers["x-ojs-attempt"] == 2
    assert json.loads(retry_headers["x-ojs-error-details"])["type"] == "payment.declined"
    assert dead_headers["x-ojs-error-code"] == "HANDLER_ERROR"
    assert dead_headers["x-ojs-attempt"] == 1
    assert json.loads(dead_headers["x-ojs-error-details"])["handler_code"] == "DEAD_LETTER"
    for headers in (retry_headers, dead_headers):
        assert {k for k in headers if k.startswith("x-ojs-")} == {
            "x-ojs-error-code", "x-ojs-error-message", "x-ojs-error-details", "x-ojs-attempt"}
        ojs = json.dumps({k: v for k, v in headers.items() if k.startswith("x-ojs-")})
        assert "raise:job" not in ojs  # the job's arguments are not in them
