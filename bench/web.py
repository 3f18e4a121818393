"""The console at scale: 10,000 dead letters and 10,000 waiting retries per framework.

``python -m bench --only web`` writes both into Redis directly, in the formats the
adapters write (Celery: kombu envelopes with the ``ojs``, ``ojs-dead-letter`` and
``x-ojs-*`` headers in ``<queue>.dead_letter`` lists and the ``_ojs.parked`` set;
Dramatiq: encoded messages, ``x-ojs-*`` in their options, in ``<ns>:<queue>.XQ`` sets
and hashes and ``<ns>:_ojs.parked``), over two queues, plus a day of decision
statistics, then times each page of the console app in process (Starlette's test
client: the server's work, no socket): the median of 5 after a warm-up, and the peak
Python memory a page allocated (``tracemalloc``, a separate pass), which stays far
below the data's size. With RabbitMQ up, the same again with a RabbitMQ broker: the
waiting retries in the index the workers keep of the delay levels (``_waiting``).
"""

from __future__ import annotations

import base64
import json
import statistics
import time
import tracemalloc
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from bench import env

#: Dead letters and waiting retries loaded per framework.
COUNT = 10_000
#: Timed requests per page (after one warm-up).
REPEAT = 5
QUEUES = ("orders", "emails")


def _job(n: int) -> int:
    """The body of the benchmark's tasks (never run: the data is written directly)."""
    return n


def _errors(n: int, attempts: int) -> list[dict[str, Any]]:
    kind = "billing.Declined" if n % 3 == 0 else "net.Timeout"
    stamp = "2026-11-24T10:00:00.000Z"
    return [{"attempt": a, "code": "HANDLER_ERROR", "type": kind,
             "message": f"job {n}: upstream said no (attempt {a})", "occurred_at": stamp,
             "timestamp": stamp} for a in range(1, attempts + 1)]


@contextmanager
def _celery(prefix: str, amqp: bool = False) -> Iterator[tuple[str, Callable[[int], str]]]:
    """A Celery app module for the console, and the data in Redis (``amqp``: the broker is
    RabbitMQ, the waiting retries are in the index of its delay levels, no dead letters)."""
    import sys
    import types

    import redis
    from celery import Celery

    from celery_ext import OjsTask
    from celery_ext._headers import HeaderState
    from celery_ext._waiting import index_key
    from ojs_adapters.history import ErrorEntry, JobRecord
    from ojs_adapters.runtime.handoff import error_headers

    app = Celery(prefix, broker=env.AMQP_URL if amqp else env.REDIS_URL, backend=env.REDIS_URL,
                 set_as_current=False, task_cls=OjsTask)
    app.conf.update(broker_transport_options={"global_keyprefix": prefix + ":"},
                    result_backend_transport_options={"global_keyprefix": prefix + ":"},
                    task_queues=None, task_default_queue=QUEUES[0])
    for q in QUEUES:
        app.task(_job, name=f"bench.{q}", queue=q, shared=False,
                 retry_policy={"max_attempts": 3, "on_exhaustion": "dead_letter"})
    module = types.ModuleType("bench_web_celery_app")
    module.app = app  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    client = redis.Redis.from_url(env.REDIS_URL)
    now = time.time()
    ids: list[str] = []
    with client.pipeline(transaction=False) as pipe:
        for n in range(COUNT if amqp else 0, 2 * COUNT):
            queue, dead = QUEUES[n % 2], n < COUNT
            job_id = str(uuid.uuid4())
            message = app.amqp.as_task_v2(job_id, f"bench.{queue}", args=(n,), kwargs={})
            errors = _errors(n, 3 if dead else 1)
            headers = dict(message.headers)
            headers["ojs"] = HeaderState(
                attempt=3 if dead else 2, errors=tuple(ErrorEntry.from_dict(e) for e in errors),
                idempotency_key=str(uuid.uuid4()),
                not_before=None if dead else now + 600 + n).encode()
            if dead:
                record = JobRecord(id=job_id, type=f"bench.{queue}", queue=queue, max_attempts=3,
                                   state="discarded", attempt=3,
                                   errors=tuple(ErrorEntry.from_dict(e) for e in errors),
                                   dead_lettered=True, outcome="dead_letter",
                                   updated_at=errors[-1]["occurred_at"])
                headers["ojs-dead-letter"] = record.to_json()
                headers.update(error_headers(record.errors[-1], 3))  # as ``_deadletter``
                ids.append(job_id)
            body = json.dumps([[n], {}, {"callbacks": None, "errbacks": None, "chain": None,
                                        "chord": None}]).encode()
            target = f"{queue}.dead_letter" if dead else queue
            envelope = json.dumps({
                "body": base64.b64encode(body).decode(), "content-encoding": "utf-8",
                "content-type": "application/json", "headers": headers,
                "properties": {"correlation_id": job_id, "reply_to": str(uuid.uuid4()),
                               "delivery_mode": 2, "priority": 0, "body_encoding": "base64",
                               "delivery_info": {"exchange": "", "routing_key": target},
                               "delivery_tag": str(uuid.uuid4())}})
            key = target if amqp else f"{prefix}:{target}"
            if dead:
                pipe.lpush(key, envelope)
            else:
                pipe.zadd(index_key(app) or "" if amqp else f"{prefix}:_ojs.parked",
                          {f"{len(key.encode())}:{key}{envelope}": now + 600 + n})
        pipe.execute()
    try:
        yield "bench_web_celery_app:app", lambda i: ids[i] if ids else ""
    finally:
        del sys.modules[module.__name__]


@contextmanager
def _dramatiq(prefix: str, amqp: bool = False) -> Iterator[tuple[str, Callable[[int], str]]]:
    """A Dramatiq broker module for the console, and the data in Redis (``amqp``: as
    ``_celery``; the records, and so the index, in a Results backend)."""
    import sys
    import types

    import dramatiq
    import redis
    from dramatiq.brokers.redis import RedisBroker
    from dramatiq.common import dq_name
    from dramatiq.message import Message

    from dramatiq_ext import OjsRetries
    from dramatiq_ext._waiting import index_of
    from ojs_adapters.history import ErrorEntry
    from ojs_adapters.runtime.handoff import error_headers

    if amqp:
        from dramatiq.brokers.rabbitmq import RabbitmqBroker
        from dramatiq.results import Results
        from dramatiq.results.backends import RedisBackend

        broker: Any = RabbitmqBroker(url=env.pika_url())
        broker.add_middleware(Results(  # type: ignore[no-untyped-call]
            backend=RedisBackend(url=env.REDIS_URL, namespace=prefix)))
    else:
        broker = RedisBroker(url=env.REDIS_URL, namespace=prefix)  # type: ignore[no-untyped-call]
    broker.add_middleware(OjsRetries())
    client = redis.Redis.from_url(env.REDIS_URL)
    index = index_of(broker.middleware[-1].store_for(broker)) if amqp else None
    for q in QUEUES:
        dramatiq.actor(_job, broker=broker, queue_name=q, actor_name=f"bench_{q}",  # type: ignore[call-overload]
                       retry_policy={"max_attempts": 3, "on_exhaustion": "dead_letter"})
    module = types.ModuleType("bench_web_dramatiq_app")
    module.broker = broker  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    now = time.time()
    ids: list[str] = []
    with client.pipeline(transaction=False) as pipe:
        for n in range(COUNT if amqp else 0, 2 * COUNT):
            queue, dead = QUEUES[n % 2], n < COUNT
            redis_id = str(uuid.uuid4())
            state = {"attempt": 3 if dead else 2, "errors": _errors(n, 3 if dead else 1)}
            options: dict[str, Any] = {"ojs": state, "idempotency_key": str(uuid.uuid4()),
                                       "redis_message_id": redis_id}
            if dead:
                state["dead_letter"] = True
                options.update(error_headers(ErrorEntry.from_dict(_errors(n, 3)[-1]), 3))
            else:
                options["eta"] = int((now + 600 + n) * 1000)
            message: Message[Any] = Message(queue_name=queue if dead else dq_name(queue),
                              actor_name=f"bench_{queue}", args=(n,), kwargs={},
                              options=options)
            if dead:
                ids.append(message.message_id)
                pipe.zadd(f"{prefix}:{queue}.XQ", {redis_id: int(now * 1000) - COUNT + n})
                pipe.hset(f"{prefix}:{queue}.XQ.msgs", redis_id, message.encode())
            else:
                member = json.dumps([dq_name(queue), redis_id, message.encode().decode()])
                pipe.zadd(index.key if index else f"{prefix}:_ojs.parked", {member: now + 600 + n})
        pipe.execute()
    try:
        yield "bench_web_dramatiq_app:broker", lambda i: ids[i] if ids else ""
    finally:
        del sys.modules[module.__name__]
        broker.close()


def _statistics(prefix: str, framework: str) -> None:
    """A day of decisions: 40 cells per minute hash and per hour hash."""
    import redis

    from ojs_adapters.runtime.stats import SEP

    client = redis.Redis.from_url(env.REDIS_URL)
    minute = int(time.time() // 60)
    fields: dict[str | bytes, bytes | float | int | str] = {
        SEP.join((framework, f"bench.task{t}", QUEUES[t % 2], d, f"err.Type{e}")): 3
        for t in range(5) for d in ("retry", "dead_letter") for e in range(4)}
    with client.pipeline(transaction=False) as pipe:
        for m in range(minute - 59, minute + 1):
            pipe.hset(f"{prefix}:m:{m}", mapping=fields)
        for h in range(minute // 60 - 24, minute // 60 + 1):
            pipe.hset(f"{prefix}:h:{h}", mapping=fields)
        pipe.execute()


def _pages(framework: str, letter: Callable[[int], str]) -> list[tuple[str, str]]:
    task = f"bench.{QUEUES[1]}" if framework == "celery" else f"bench_{QUEUES[1]}"
    last, first = COUNT // 50, letter(0)
    return [
        ("overview", "/"),
        ("waiting retries, page 1", "/waiting?source=parked"),
        ("waiting retries, page 100", "/waiting?source=parked&page=100"),
        ("waiting retries, filter task", f"/waiting?source=parked&task={task}"),
        ("dead letters, page 1", "/dead-letters"),
        (f"dead letters, page {last}", f"/dead-letters?page={last}"),
        ("dead letters, filter queue", f"/dead-letters?queue={QUEUES[0]}"),
        ("dead letters, filter error type", "/dead-letters?error=billing.*"),
        ("dead letters, filter task", f"/dead-letters?task={task}"),
        ("dead letters, filter date", "/dead-letters?since=2020-01-01"),
        ("dead letter (from the listing)", f"/dead-letter?id={first}&queue={QUEUES[0]}"),
        ("confirm: replay by filter", "/confirm?action=replay&error=billing.*"),
        ("metrics", "/metrics"),
    ]


def _time(client: Any, path: str) -> tuple[float, float, int]:
    """Median ms of ``REPEAT`` requests, peak KiB allocated by one, and the status."""
    status = client.get(path).status_code  # warm-up
    times = []
    for _ in range(REPEAT):
        began = time.perf_counter()
        client.get(path)
        times.append((time.perf_counter() - began) * 1000)
    tracemalloc.start()
    client.get(path)
    _current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return statistics.median(times), peak / 1024, status


def run() -> list[dict[str, Any]]:
    """Load, time, clean up; one row per framework and page."""
    from starlette.testclient import TestClient

    from ojs_adapters.web import ConsoleSettings, create_app

    rows: list[dict[str, Any]] = []
    cells = [(f, amqp) for amqp in (False, True) for f in ("celery", "dramatiq")
             if not amqp or env.reachable("rabbitmq")]
    for framework, amqp in cells:
        loader, prefix = _celery if framework == "celery" else _dramatiq, env.namespace(
            f"web-{framework}")
        began = time.perf_counter()
        try:
            with loader(prefix, amqp) as (app, letter):
                _statistics(f"{prefix}-stats", framework)
                loaded = time.perf_counter() - began
                settings = ConsoleSettings(framework=framework, app=app, stats_url=env.REDIS_URL,
                                           stats_prefix=f"{prefix}-stats",
                                           tokens={"bench": "bench-token-0123456789"})
                with TestClient(create_app(settings)) as client:
                    client.headers["Authorization"] = "Bearer bench-token-0123456789"
                    for name, path in _pages(framework, letter):
                        if amqp and ("dead" in name or "confirm" in name):
                            continue  # on RabbitMQ: the waiting retries only
                        if name.startswith("dead letter (") and framework == "dramatiq":
                            path += "&key=" + _dramatiq_key(client, path)
                        ms, kib, status = _time(client, path)
                        rows.append({"framework": framework, "page": name, "ms": round(ms, 1),
                                     "broker": "rabbitmq" if amqp else "redis",
                                     "peak_kib": round(kib), "status": status,
                                     "load_s": round(loaded, 1)})
        finally:
            env.delete_redis_keys(prefix)
    return rows


def _dramatiq_key(client: Any, path: str) -> str:
    """The ``key`` the dead-letters listing links a Dramatiq letter with (its Redis id)."""
    listing = client.get("/dead-letters").text
    marker = f"id={path.split('id=')[1].split('&')[0]}&amp;queue={QUEUES[0]}&amp;key="
    return listing.split(marker)[1].split('"')[0] if marker in listing else ""


def print_table(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Console pages with {COUNT:,} dead letters and {COUNT:,} waiting "
                        "retries (RabbitMQ: the waiting retries only; median of 5)")
    for header in ("framework", "broker", "page", "ms", "peak KiB", "status"):
        table.add_column(header, justify="left" if header.isalpha() else "right")
    for row in rows:
        table.add_row(row["framework"], row.get("broker", "redis"), row["page"],
                      f"{row['ms']:.1f}", str(row["peak_kib"]), str(row["status"]))
    Console(width=120).print(table)
