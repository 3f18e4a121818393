"""Issue 11, Dramatiq: the broker link is cut exactly while a retry or a dead letter is published.

Each test owns a ``Proxy`` in front of the shared broker (never touched itself)
and cuts it from inside ``Publisher.publish_once``, just before the publish: a
short outage (the in-place retries ride it out) on the first retry, and a long
one (the ack is held, Dramatiq retries ``before_ack``) on the first dead letter.
Then every job must be completed or dead-lettered exactly once, and no attempt
may run twice. The RabbitMQ test also reads the ``x-ojs-*`` AMQP headers of a
retried and of a dead-lettered message off the broker.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from dramatiq.middleware import CurrentMessage

import dramatiq_ext._outcome as outcome_module  # where the in-place dead letter is called
from dramatiq_ext._state import MessageState
from ojs_adapters.runtime.backend_retry import FAILURES_REGISTRY
from tests.brokers import AMQP_URL, REDIS_URL
from tests.dramatiq_ext.harness import Env, make_env, pika_url
from tests.handoff.proxy import Proxy

#: Jobs per run: even ones succeed on attempt 2, odd ones are dead-lettered after it.
JOBS = 6
POLICY = {"max_attempts": 2, "initial_interval": "PT0.1S", "jitter": False,
          "on_exhaustion": "dead_letter"}
#: Outage length per hand-off kind, seconds: within, then beyond, the in-place retries.
OUTAGES = {"retry": 0.8, "dead letter": 3.5}


@pytest.fixture(params=["redis", "rabbitmq"])
def faulty(request: pytest.FixtureRequest, redis_url: str) -> Iterator[tuple[Env, Proxy]]:
    """An env whose broker traffic goes through a proxy the test cuts (records too, on Redis)."""
    logging.getLogger("pika").setLevel(logging.CRITICAL)  # a refused handshake per reconnect try
    if request.param == "redis":
        proxy = Proxy("127.0.0.1", 6379)
        urls = {"redis_url": f"redis://127.0.0.1:{proxy.port}/0"}
    else:
        request.getfixturevalue("amqp_url")
        proxy = Proxy("127.0.0.1", 5672)
        urls = {"redis_url": redis_url,
                "amqp_url": f"amqp://guest:guest@127.0.0.1:{proxy.port}//"}
    try:
        with make_env(request.param, extra=[CurrentMessage()], **urls) as env:  # type: ignore[arg-type]
            yield env, proxy
            proxy.restore()
            if request.param == "rabbitmq":
                del env.broker.connection  # this thread's link died in a cut: a fresh one
    finally:
        proxy.close()


def _until(probe: Any, *, timeout: float) -> Any:
    """Poll ``probe`` until it returns something truthy; errors (the link is cut) mean "not yet"."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = probe()
        except Exception:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout}s")
        time.sleep(0.1)


def _drain_dead_directly(env: Env) -> list[Any]:
    """Take the messages off the env's dead-letter queue, bypassing the proxy."""
    from dramatiq.message import Message

    if env.kind == "redis":
        import redis

        client = redis.Redis.from_url(REDIS_URL)
        key = f"{env.namespace}:{env.queue}.XQ"
        ids = client.zrange(key, 0, -1)
        datas = client.hmget(key + ".msgs", ids) if ids else []
        if ids:
            client.zrem(key, *ids)
        return [Message.decode(d) for d in datas if d is not None]
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(pika_url(AMQP_URL)))
    try:
        channel, out = connection.channel(), []
        while True:
            method, _props, body = channel.basic_get(f"{env.queue}.XQ", auto_ack=True)
            if method is None:
                return out
            out.append(Message.decode(body))
    finally:
        connection.close()


def _replace_redis_worker(env: Env, actor: Any, job: Any, policy: Any) -> None:
    """Stop the worker; start another (a new broker id) that requeues the old one's acks."""
    import dramatiq

    from dramatiq_ext import OjsRetries
    from tests.dramatiq_ext.harness import build_broker

    for worker in env.workers:
        worker.stop(timeout=5000)
    env.workers.clear()
    url = env.broker.client.connection_pool.connection_kwargs
    broker, _ = build_broker("redis", env.namespace, extra=[CurrentMessage()],
                             redis_url=f"redis://{url['host']}:{url['port']}/0",
                             heartbeat_timeout=1000, maintenance_chance=1_000_000)
    broker.add_middleware(OjsRetries(jitter_source=lambda: 0.5))
    dramatiq.actor(job, broker=broker, queue_name=env.queue, actor_name=actor.actor_name,
                   retry_policy=policy)
    env.broker.close()
    env.broker = broker
    env.start(threads=4)


def _attempt_now() -> int:
    message = CurrentMessage.get_current_message()
    assert message is not None
    return MessageState.of(message.options).attempt


@pytest.mark.broker
@pytest.mark.slow
def test_issue11_cut_during_retry_and_dead_letter_publish_loses_nothing(
        faulty: tuple[Env, Proxy], monkeypatch: pytest.MonkeyPatch) -> None:
    env, proxy = faulty
    runs: Counter[tuple[int, int]] = Counter()
    succeeded: list[int] = []
    lock = threading.Lock()

    def job(i: int) -> None:
        attempt = _attempt_now()
        with lock:
            runs[(i, attempt)] += 1
        if attempt == 1 or i % 2:
            raise RuntimeError(f"job {i} failed attempt {attempt}")
        succeeded.append(i)

    actor = env.actor(job, retry_policy=POLICY)
    plan, cuts, duplicated = dict(OUTAGES), [], []
    real = env.ojs.publisher.publish_once

    def cutting(broker: Any, message: Any, delay: Any, headers: Any) -> None:
        state = MessageState.of(message.options)
        kind = "dead letter" if state.dead_letter else "retry"
        with lock:
            if kind in plan and proxy.up:
                cuts.append(kind)
                proxy.cut_for(plan.pop(kind))  # the broker goes away just before the publish
            twice = kind == "retry" and not duplicated and proxy.up
            if twice:
                duplicated.append(message.message_id)
        real(broker, message, delay, headers)
        if twice:  # the same copy twice (a broker redelivery, a delay-queue hop forwarded
            real(broker, message, delay, headers)  # twice): the second waits, then is dropped

    env.ojs.publisher.publish_once = cutting  # type: ignore[method-assign]
    in_place = outcome_module.dead_letter_in_place

    def cutting_in_place(broker: Any, store: Any, message: Any, dead: Any, record: Any) -> Any:
        # A RedisBroker's dead letter is written in place (``_dead_letter``), not published:
        # the link goes away just before that write instead.
        with lock:
            if env.kind == "redis" and "dead letter" in plan and proxy.up:
                cuts.append("dead letter")
                proxy.cut_for(plan.pop("dead letter"))
        return in_place(broker, store, message, dead, record)

    monkeypatch.setattr(outcome_module, "dead_letter_in_place", cutting_in_place)
    in_one_call = outcome_module.enqueue_with_record

    def cutting_one_call(broker: Any, store: Any, message: Any, delay: Any, record: Any) -> None:
        # A RedisBroker's retry is enqueued with its record in one script (``_redis_retry``),
        # not published: the link goes away just before that call instead, and the same
        # copy goes twice once, as through ``publish_once`` above.
        with lock:
            if "retry" in plan and proxy.up:
                cuts.append("retry")
                proxy.cut_for(plan.pop("retry"))
            twice = not duplicated and proxy.up
            if twice:
                duplicated.append(message.message_id)
        in_one_call(broker, store, message, delay, record)
        if twice:
            in_one_call(broker, store, message, delay, record)

    monkeypatch.setattr(outcome_module, "enqueue_with_record", cutting_one_call)
    failures_before = sum(v for k, v in FAILURES_REGISTRY.items() if k.startswith("publish"))
    started = time.monotonic()
    ids = [actor.send(i).message_id for i in range(JOBS)]  # all sent before any cut
    env.start(threads=4)

    seen_dead: list[Any] = []

    def dead_letters() -> list[Any]:
        seen_dead.extend(_drain_dead_directly(env))
        return list(seen_dead)

    def all_ended() -> list[Any] | None:
        dead = dead_letters()
        return dead if len(set(succeeded)) + len(dead) >= JOBS else None

    if env.kind == "redis":
        # Dramatiq's Redis consumer drops its in-memory delay queue on a connection error,
        # leaving those retries in this worker's ack set until the worker is replaced (see
        # the middleware docstring): replace it, as a supervisor would, once the link is back.
        _until(lambda: len(cuts) == 2 and proxy.up, timeout=30)
        time.sleep(6.0)  # the held acks (5 s apart) go through
        _replace_redis_worker(env, actor, job, POLICY)
    try:
        dead = _until(all_ended, timeout=45)  # the observer goes through the proxy too
    except AssertionError:
        print("DEBUG", cuts, proxy.up, dict(runs), succeeded, duplicated,
              [(r.state, r.attempt, r.outcome, r.extra.get("handed_off")) if r else None
               for r in map(env.record, ids)], [m.message_id for m in dead_letters()], ids)
        raise
    time.sleep(1.0)  # a duplicate, were there one, would arrive now
    dead = dead_letters()
    elapsed = time.monotonic() - started
    records = {i: _until(lambda m=m: env.record(m), timeout=10) for i, m in enumerate(ids)}
    stale = [i for i, r in records.items() if r.state not in ("completed", "discarded")]

    dead_ids = Counter(m.message_id for m in dead)
    publish_failures = sum(v for k, v in FAILURES_REGISTRY.items()
                           if k.startswith("publish")) - failures_before
    print(f"\n{env.kind}: {len(set(succeeded))} completed, {len(dead_ids)} dead-lettered, "
          f"{sum(runs.values())} runs, cuts={cuts}, duplicate retry of {duplicated}, "
          f"{publish_failures} failed publish tries, records left stale by failed writes: "
          f"{stale}, {elapsed:.1f}s")
    assert sorted(cuts) == ["dead letter", "retry"]
    assert duplicated and publish_failures >= 1
    assert sorted(succeeded) == [i for i in range(JOBS) if i % 2 == 0], "a job did not complete"
    assert sorted(dead_ids) == sorted(ids[i] for i in range(JOBS) if i % 2)
    assert set(dead_ids.values()) == {1}, "a job was dead-lettered twice"
    assert runs == {(i, a): 1 for i in range(JOBS) for a in (1, 2)}, "an attempt ran twice"
    for message in dead:  # the dead letter holds the whole history, whatever the record
        assert [e["attempt"] for e in message.options["ojs"]["errors"]] == [1, 2]


@pytest.fixture
def rabbit(redis_url: str, amqp_url: str) -> Iterator[Env]:
    with make_env("rabbitmq", redis_url=redis_url, amqp_url=amqp_url) as env:
        yield env


def test_err008_rabbitmq_retry_and_dead_letter_carry_x_ojs_headers(rabbit: Env,
                                                                  amqp_url: str) -> None:
    """Read the headers off the broker: the retry waiting in ``.DQ``, the dead letter in ``.XQ``."""
    from ojs_adapters import JobError

    def failing(card: str) -> None:
        raise JobError("payment.declined", "card declined", details={"gateway": "acme"})

    actor = rabbit.actor(failing, retry_policy={"max_attempts": 2, "initial_interval": "PT60S",
                                                "on_exhaustion": "dead_letter"})
    dead_actor = rabbit.actor(failing, retry_policy={"max_attempts": 1,
                                                     "on_exhaustion": "dead_letter"})
    worker = rabbit.start()
    retried = actor.send("secret-arg-1")
    dead = dead_actor.send("secret-arg-2")
    rabbit.wait_record(retried.message_id, done=lambda r: r.state == "retryable")
    rabbit.wait_record(dead.message_id)
    time.sleep(0.5)  # the dead-letter hop reaches .XQ
    worker.stop(timeout=5000)  # closes the consumers: the waiting retry goes back to .DQ
    rabbit.workers.clear()

    import pika

    connection = pika.BlockingConnection(pika.URLParameters(pika_url(amqp_url)))
    got: dict[str, tuple[dict[str, Any], bytes]] = {}
    try:
        channel = connection.channel()
        for queue in (f"{rabbit.queue}.DQ", f"{rabbit.queue}.XQ"):
            deadline = time.monotonic() + 10
            while queue not in got and time.monotonic() < deadline:
                method, props, body = channel.basic_get(queue, auto_ack=False)
                if method is None:
                    time.sleep(0.1)
                    continue
                got[queue] = (props.headers or {}, body)
                channel.basic_nack(method.delivery_tag, requeue=True)
    finally:
        connection.close()
    retry_headers, retry_body = got[f"{rabbit.queue}.DQ"]
    dead_headers, dead_body = got[f"{rabbit.queue}.XQ"]
    print(f"\nretry headers: {retry_headers}\ndead-letter headers: {dead_headers}")
    assert retry_headers["x-ojs-error-code"] == "HANDLER_ERROR"
    assert retry_headers["x-ojs-error-message"] == "card declined"
    assert retry_headers["x-ojs-attempt"] == 2
    details = json.loads(retry_headers["x-ojs-error-details"])
    assert (details["type"], details["attempt"], details["details"]) == (
        "payment.declined", 1, {"gateway": "acme"})
    assert dead_headers["x-ojs-error-code"] == "HANDLER_ERROR"
    assert dead_headers["x-ojs-attempt"] == 1
    assert json.loads(dead_headers["x-ojs-error-details"])["attempt"] == 1
    for headers in (retry_headers, dead_headers):
        assert {k for k in headers if k.startswith("x-ojs-")} == {
            "x-ojs-error-code", "x-ojs-error-message", "x-ojs-error-details", "x-ojs-attempt"}
        assert "secret-arg" not in json.dumps({k: str(v) for k, v in headers.items()})
    assert b"secret-arg-1" in retry_body and b"secret-arg-2" in dead_body  # payload untouched
