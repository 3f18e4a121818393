"""Dramatiq's own Prometheus metrics under OjsRetries read as they do under Dramatiq's Retries.

The same two jobs run on a real worker twice: under Dramatiq's ``Retries`` with its
``Prometheus`` (one job fails three times and is dead-lettered, one fails once and then
succeeds), and under ``OjsRetries`` with ``OjsPrometheus`` (the same, as a retry policy).
Every Dramatiq metric must come out the same, label for label (the queue's name aside):
in-progress back to 0, each attempt counted once (the dead-letter hop is none), each
retry counted, the dead letter rejected once.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import dramatiq
import pytest
from dramatiq.middleware import AgeLimit, Retries
from dramatiq.middleware.prometheus import Prometheus

from dramatiq_ext.prometheus import OjsPrometheus
from ojs_adapters import JobError
from tests.dramatiq_ext.harness import build_broker, make_env

pytest.importorskip("prometheus_client")

#: Dramatiq's metrics, by the middleware attribute that holds each.
METRICS = ("total_messages", "total_errored_messages", "total_retried_messages",
           "total_rejected_messages", "inprogress_messages", "inprogress_delayed_messages",
           "message_durations")
#: Three attempts, 0.1 s apart, then the dead-letter queue (Dramatiq: ``max_retries=2``).
POLICY: dict[str, Any] = {"max_attempts": 3, "initial_interval": "PT0.1S", "jitter": False,
                          "on_exhaustion": "dead_letter"}


def readings(prom: Prometheus, queue: str) -> Counter[tuple[str, str]]:
    """``{(metric, queue label with the queue's name as Q): value}``, summed over actors;
    for the duration histogram, its count only."""
    out: Counter[tuple[str, str]] = Counter()
    for name in METRICS:
        for metric in getattr(prom, name).collect():
            for sample in metric.samples:
                if sample.name.endswith(("_created", "_bucket", "_sum")):
                    continue
                label = sample.labels["queue_name"].replace(queue, "Q")
                out[(sample.name, label)] += sample.value
    return out


def booted(prom: Any, broker: Any) -> None:
    """What a ``dramatiq`` worker process does at boot, without leaving the multiprocess
    variables set in this process (prometheus-client is imported: values stay in memory)."""
    saved = {k: os.environ.get(k) for k in ("PROMETHEUS_MULTIPROC_DIR",
                                            "prometheus_multiproc_dir")}
    try:
        prom.after_process_boot(broker)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def jobs(fail_once: threading.Event, failure: Callable[[], BaseException]) -> tuple[Any, Any]:
    def doomed() -> None:
        raise failure()

    def flaky() -> None:
        if not fail_once.is_set():
            fail_once.set()
            raise failure()

    return doomed, flaky


def settle(read: Callable[[], Counter[tuple[str, str]]], done: Callable[[Counter[Any]], bool],
           timeout: float = 20.0) -> Counter[tuple[str, str]]:
    """Poll ``read`` until ``done``, then a little longer for late acks."""
    deadline = time.monotonic() + timeout
    while not done(values := read()):
        if time.monotonic() > deadline:
            raise AssertionError(f"metrics never settled: {dict(values)}")
        time.sleep(0.05)
    time.sleep(0.5)
    return read()


def finished(values: Counter[tuple[str, str]]) -> bool:
    return (values[("dramatiq_messages_total", "Q")] >= 5
            and values[("dramatiq_message_rejects_total", "Q")] >= 1)


def native_readings(kind: str, urls: dict[str, str]) -> Counter[tuple[str, str]]:
    broker, _ = build_broker(kind, f"ojs-test-{uuid.uuid4().hex[:10]}",
                             **urls)  # type: ignore[arg-type]
    prom = Prometheus()
    broker.add_middleware(prom)
    for middleware in broker.middleware:
        if isinstance(middleware, Retries):
            middleware.min_backoff, middleware.max_backoff = 100, 100
    booted(prom, broker)
    queue = f"ojs_test_{uuid.uuid4().hex[:10]}"
    doomed, flaky = jobs(threading.Event(), lambda: ValueError("down"))
    options: dict[str, Any] = {"broker": broker, "queue_name": queue, "max_retries": 2}
    declare: Any = dramatiq.actor
    actors = [declare(fn, actor_name=f"{fn.__name__}_{queue}", **options)
              for fn in (doomed, flaky)]
    worker = dramatiq.Worker(broker, worker_timeout=100, worker_threads=2)
    worker.start()
    try:
        for actor in actors:
            actor.send()
        return settle(lambda: readings(prom, queue), finished)
    finally:
        worker.stop(timeout=5000)
        if kind == "rabbitmq":
            for suffix in ("", ".DQ", ".XQ"):
                broker.channel.queue_delete(queue + suffix)
        broker.close()


@pytest.mark.broker
@pytest.mark.parametrize("placed", ["after_ojs_retries", "first"])
@pytest.mark.parametrize("kind", ["stub", "redis", "rabbitmq"])
def test_dramatiq_prometheus_reads_as_under_dramatiq_retries(
        kind: str, placed: str, request: pytest.FixtureRequest) -> None:
    urls: dict[str, str] = {}
    if kind != "stub":
        urls["redis_url"] = request.getfixturevalue("redis_url")
    if kind == "rabbitmq":
        urls["amqp_url"] = request.getfixturevalue("amqp_url")
    native = native_readings(kind, urls)
    prom = OjsPrometheus()
    with make_env(kind, **urls) as env:  # type: ignore[arg-type]
        env.broker.add_middleware(prom, **({"before": AgeLimit} if placed == "first" else {}))
        booted(prom, env.broker)
        doomed, flaky = jobs(threading.Event(), lambda: JobError("net.Timeout", "down"))
        for fn in (doomed, flaky):
            env.actor(fn, retry_policy=POLICY).send()
        env.start()
        ours = settle(lambda: readings(prom, env.queue), finished)
    assert native[("dramatiq_messages_inprogress", "Q")] == 0  # what the jobs give natively:
    assert native[("dramatiq_messages_total", "Q")] == 5  # 3 + 2 attempts
    assert native[("dramatiq_message_retries_total", "Q.DQ")] == 3  # 2 + 1 retries, sent
    assert native[("dramatiq_message_retries_total", "Q")] == 3  # and moved off the .DQ
    assert native[("dramatiq_message_rejects_total", "Q")] == 1
    assert ours == native, {k: (ours[k], native[k]) for k in set(ours) | set(native)
                            if ours[k] != native[k]}


@pytest.mark.broker
@pytest.mark.parametrize("middleware", [Prometheus, OjsPrometheus])
def test_a_worker_with_dramatiqs_prometheus_says_to_use_ojs_prometheus(
        middleware: type[Prometheus], redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """Nothing degrades silently (DESIGN.md): a worker started with Dramatiq's own
    ``Prometheus`` beside ``OjsRetries`` warns once, naming the replacement."""
    with caplog.at_level(logging.WARNING, logger="dramatiq_ext"), \
            make_env("redis", redis_url=redis_url, extra=[middleware()]) as env:
        env.start()
    said = [r for r in caplog.records if "OjsPrometheus" in r.getMessage()]
    assert len(said) == (1 if middleware is Prometheus else 0), said


@pytest.mark.broker
@pytest.mark.parametrize("kind", ["redis", "rabbitmq"])
def test_a_delivery_ojs_retries_drops_unrun_is_no_message(
        kind: str, request: pytest.FixtureRequest) -> None:
    """A second delivery of a finished attempt (OjsRetries drops it as a duplicate, unrun)
    leaves in-progress at 0 and counts no message nor error: only the attempt that ran
    counts (with Dramatiq's Prometheus: in-progress -1, 2 messages, 1 error)."""
    urls = {"redis_url": request.getfixturevalue("redis_url")}
    if kind == "rabbitmq":
        urls["amqp_url"] = request.getfixturevalue("amqp_url")
    prom = OjsPrometheus()
    with make_env(kind, extra=[prom], **urls) as env:
        booted(prom, env.broker)
        sent = env.actor(lambda: None).send()
        env.start()
        env.wait_record(sent.message_id)
        env.broker.enqueue(sent)  # the same attempt delivered again
        time.sleep(1.0)  # the duplicate is dropped as it arrives: nothing to wait on
        env.wait_record(sent.message_id)
        values = settle(lambda: readings(prom, env.queue),
                        lambda v: v[("dramatiq_messages_total", "Q")] >= 1)
    assert values[("dramatiq_messages_inprogress", "Q")] == 0, values
    assert values[("dramatiq_messages_total", "Q")] == 1, values
    assert values[("dramatiq_message_errors_total", "Q")] == 0, values


@pytest.mark.broker
def test_retries_count_in_a_worker_started_after_another_stopped(redis_url: str) -> None:
    """A worker started in a process whose earlier worker stopped counts retries too."""
    prom = OjsPrometheus()
    with make_env("redis", redis_url=redis_url, extra=[prom]) as env:
        booted(prom, env.broker)
        _, flaky = jobs(threading.Event(), lambda: JobError("net.Timeout", "down"))
        actor = env.actor(flaky, retry_policy=POLICY)
        env.start().stop(timeout=5000)
        env.workers.clear()
        env.start()
        sent = actor.send()
        env.wait_record(sent.message_id, done=lambda r: r.state == "completed")
        values = settle(lambda: readings(prom, env.queue),
                        lambda v: v[("dramatiq_messages_total", "Q")] >= 2)
    assert values[("dramatiq_message_retries_total", "Q.DQ")] == 1, values
    assert values[("dramatiq_message_retries_total", "Q")] == 1, values
