"""One delivery lifecycle, two frameworks: a real worker on a real broker behind one API.

A *lane* is Celery (``OjsTask``, an in-process worker, threads pool) or Dramatiq
(``OjsRetries``, an in-process ``dramatiq.Worker``) on Redis or RabbitMQ, with the job
records in the real Redis. A test declares jobs, starts the worker, sends, and reads
what happened (runs per attempt, the job record, the dead-letter queue, the decision
events, the adapter's log lines) the same way on both, so one test body, parametrised
over the lanes, proves that both frameworks behave the same.

``store_url`` sends the record store's traffic (records, claims, leases) through a URL
the test controls (a ``tests.handoff.proxy.Proxy`` it can cut); the broker is reached
directly. Isolation: queue names, Redis key prefixes and namespaces are the test's own
(``tests.celery_ext.support.Broker``, ``tests.dramatiq_ext.harness.make_env``), and only
those are removed afterwards.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

from ojs_adapters import JobRecord
from ojs_adapters.runtime.backend_retry import BackendRetry
from ojs_adapters.runtime.events import DecisionEvent, add_hook, remove_hook
from ojs_adapters.runtime.leases import lease
from tests.brokers import AMQP_URL, REDIS_URL

#: What a job body gets: its payload (a dict, mutable, as the framework decoded it) and
#: the attempt it runs as.
Body = Callable[[dict[str, Any], int], Any]
#: Store and broker calls tried twice, 50 ms apart: an outage is seen in well under a second.
FAST_BACKEND_RETRY = BackendRetry(tries=2, initial=0.05, jitter=False)


class LogLines(logging.Handler):
    """The adapters' log records (``celery_ext``, ``dramatiq_ext``), from every thread."""

    NAMES = ("celery_ext", "dramatiq_ext")

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self._lock_ = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        with self._lock_:
            self.records.append(record)

    def lines(self, *needles: str, level: int = logging.WARNING) -> list[str]:
        """The messages at ``level`` or above that contain every one of ``needles``."""
        with self._lock_:
            found = [r.getMessage() for r in self.records if r.levelno >= level]
        return [m for m in found if all(n in m for n in needles)]


@dataclass
class Lane:
    """The common face of both frameworks (see the module docstring)."""

    framework: str
    kind: str  # "redis" or "amqp"
    runs: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    events: list[DecisionEvent] = field(default_factory=list)
    logs: LogLines = field(default_factory=LogLines)
    ids: set[str] = field(default_factory=set)

    def note(self, job_id: str, attempt: int) -> None:
        self.runs[job_id].append(attempt)

    def on_event(self, event: DecisionEvent) -> None:
        if event.job_id in self.ids:
            self.events.append(event)

    def events_of(self, job_id: str) -> list[DecisionEvent]:
        return [e for e in self.events if e.job_id == job_id]

    # -- per framework ------------------------------------------------------------------
    def declare(self, body: Body, *, policy: dict[str, Any] | None = None,
                time_limit: float | None = None) -> Any:
        raise NotImplementedError

    def name_of(self, job: Any) -> str:
        """The job's task or actor name, as the adapter's log lines spell it."""
        raise NotImplementedError

    def start(self) -> None:
        raise NotImplementedError

    def send(self, job: Any, payload: dict[str, Any], *, job_id: str | None = None) -> str:
        raise NotImplementedError

    def record(self, job_id: str) -> JobRecord | None:
        raise NotImplementedError

    def dead_letter_ids(self, *, expect: int, timeout: float) -> list[str]:
        """Ids of the messages taken off the dead-letter queue (waits for ``expect`` of them)."""
        raise NotImplementedError

    def take_lease(self, job_id: str, attempt: int, holder: str, ttl_ms: int) -> bool | None:
        """Take (or renew) the lease on ``job_id``'s ``attempt`` as another delivery would."""
        raise NotImplementedError

    # -- shared -------------------------------------------------------------------------
    def wait_record(self, job_id: str, done: Callable[[JobRecord], bool], *,
                    timeout: float = 30.0) -> JobRecord:
        deadline = time.monotonic() + timeout
        while True:
            try:
                record = self.record(job_id)
            except Exception:  # the store is cut
                record = None
            if record is not None and done(record):
                return record
            if time.monotonic() > deadline:
                raise AssertionError(f"record of {job_id} never got there: {record}")
            time.sleep(0.05)


def wait_until(probe: Callable[[], Any], *, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout}s")
        time.sleep(0.05)


class CeleryLane(Lane):
    def __init__(self, kind: str, stack: ExitStack, *, store_url: str | None) -> None:
        super().__init__("celery", kind)
        from tests.celery_ext.support import Broker

        broker_url = REDIS_URL if kind == "redis" else AMQP_URL
        self.broker = Broker(kind, broker_url, store_url or REDIS_URL)
        self.app = self.broker.make_app(f"ojs-lifecycle-{uuid.uuid4().hex[:6]}")
        self.app.conf.ojs_backend_retry = FAST_BACKEND_RETRY
        self.queue = self.broker.queue_name("lc")
        self.stack = stack
        self.tasks: list[Any] = []
        stack.callback(self.broker.cleanup, self.app)

    def declare(self, body: Body, *, policy: dict[str, Any] | None = None,
                time_limit: float | None = None) -> Any:
        from celery_ext import OjsTask

        lane = self

        def run(self: Any, payload: dict[str, Any]) -> Any:
            attempt = self.ojs.attempt
            lane.note(self.request.id, attempt)
            return body(payload, attempt)

        options: dict[str, Any] = {"retry_policy": policy or {}}
        if time_limit is not None:
            options["time_limit"] = time_limit
        task = self.app.task(shared=False, base=OjsTask, bind=True,
                             name=f"{self.app.main}.job{len(self.tasks)}", **options)(run)
        self.tasks.append(task)
        return task

    def name_of(self, job: Any) -> str:
        return str(job.name)

    def start(self) -> None:
        from celery.contrib.testing.worker import start_worker

        from tests.celery_ext.support import wake_for_shutdown

        wake = self.declare(lambda payload, attempt: None)
        self.stack.enter_context(start_worker(
            self.app, pool="threads", concurrency=4, perform_ping_check=False,
            queues=[self.queue], loglevel="WARNING", shutdown_timeout=30))

        self.stack.callback(wake_for_shutdown, wake, {}, queue=self.queue, ignore_result=True)

    def send(self, job: Any, payload: dict[str, Any], *, job_id: str | None = None) -> str:
        job_id = job_id or str(uuid.uuid4())
        self.ids.add(job_id)
        # ignore_result: the result backend (the store) may be cut while the job is sent
        job.apply_async((payload,), queue=self.queue, task_id=job_id, ignore_result=True)
        return job_id

    def record(self, job_id: str) -> JobRecord | None:
        from celery_ext import get_job_record

        return get_job_record(job_id, app=self.app)

    def dead_letter_ids(self, *, expect: int, timeout: float) -> list[str]:
        from tests.celery_ext.support import drain

        messages = drain(self.app, f"{self.queue}.dead_letter", expect=expect, timeout=timeout)
        return [str(m.headers["id"]) for m in messages]

    def take_lease(self, job_id: str, attempt: int, holder: str, ttl_ms: int) -> bool | None:
        from celery_ext.records import RecordStore

        return lease(RecordStore(self.app.backend), f"{job_id}:{attempt}", holder, ttl_ms)


class DramatiqLane(Lane):
    def __init__(self, kind: str, stack: ExitStack, *, store_url: str | None,
                 middleware: list[Any]) -> None:
        super().__init__("dramatiq", kind)
        self.dead_seen = 0
        from dramatiq_ext import OjsRetries, RedisRecordStore
        from tests.dramatiq_ext.harness import make_env

        namespace = f"ojs-test-{uuid.uuid4().hex[:10]}"
        stack.callback(_delete_keys, f"{namespace}:*")  # after the worker stopped
        store = RedisRecordStore(url=store_url or REDIS_URL, prefix=f"{namespace}:ojs-record")
        ojs = OjsRetries(jitter_source=lambda: 0.5, store=store,
                         backend_retry=FAST_BACKEND_RETRY)
        self.env = stack.enter_context(make_env(
            "redis" if kind == "redis" else "rabbitmq", redis_url=REDIS_URL,
            amqp_url=AMQP_URL, ojs=ojs, extra=middleware))

    def declare(self, body: Body, *, policy: dict[str, Any] | None = None,
                time_limit: float | None = None) -> Any:
        from dramatiq_ext import current_job

        lane = self

        def job(payload: dict[str, Any]) -> Any:
            context = current_job()
            assert context is not None
            lane.note(context.job_id, context.attempt)
            return body(payload, context.attempt)

        options: dict[str, Any] = {"retry_policy": policy or {}}
        if time_limit is not None:
            options["time_limit"] = int(time_limit * 1000)
        return self.env.actor(job, **options)

    def name_of(self, job: Any) -> str:
        return str(job.actor_name)

    def start(self) -> None:
        self.env.start(threads=4)

    def send(self, job: Any, payload: dict[str, Any], *, job_id: str | None = None) -> str:
        message = job.message(payload)
        if job_id is not None:
            message = message.copy(message_id=job_id)
        self.ids.add(message.message_id)
        self.env.broker.enqueue(message)
        return str(message.message_id)

    def record(self, job_id: str) -> JobRecord | None:
        return self.env.record(job_id)

    def dead_letter_ids(self, *, expect: int, timeout: float) -> list[str]:
        seen = self.dead_seen  # the harness returns every dead letter it ever drained
        found = self.env.dead_letters(expect=seen + expect, timeout=timeout)
        self.dead_seen = len(found)
        return [m.message_id for m in found[seen:]]

    def take_lease(self, job_id: str, attempt: int, holder: str, ttl_ms: int) -> bool | None:
        return lease(self.env.ojs.store_for(self.env.broker), f"{job_id}:{attempt}", holder,
                     ttl_ms)


def _delete_keys(pattern: str) -> None:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(match=pattern, count=500))
    if keys:
        client.delete(*keys)


@contextmanager
def open_lane(framework: str, kind: str, *, store_url: str | None = None,
              middleware: list[Any] | None = None) -> Iterator[Lane]:
    """A lane of ``framework`` on ``kind``, its hooks and log capture installed; all removed
    (worker stopped, queues and keys deleted) on exit. ``middleware``: Dramatiq only."""
    with ExitStack() as stack:
        lane: Lane = CeleryLane(kind, stack, store_url=store_url) if framework == "celery" \
            else DramatiqLane(kind, stack, store_url=store_url, middleware=middleware or [])
        add_hook(lane.on_event)
        stack.callback(remove_hook, lane.on_event)
        for name in LogLines.NAMES:
            logging.getLogger(name).addHandler(lane.logs)
            stack.callback(logging.getLogger(name).removeHandler, lane.logs)
        yield lane
