"""The apps the console tests run: one Celery app or Dramatiq broker per test cell.

The test process builds them with ``celery_app(cell)`` / ``dramatiq_broker(cell)``
and runs real workers on them; the ``ojs-retry web`` it starts imports the same
thing by name (``--app tests.web.apps:celery_app``), built from ``$OJS_WEB_TEST_CELL``
(``framework:broker kind:prefix``), so both sides see the same queues, prefixes
and record stores.

Every task fails while its job number is not in ``HEALED`` (in the worker's
process): ``doomed`` dead-letters at once, ``slow`` asks for a retry in 120 s
(parked on the broker), ``brisk`` for one in 8 s (parked too: the cells park
anything over ``PARK_AFTER`` s); each error message carries markup that must be
shown as text. ``RUNS`` counts the runs of each job number.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from dataclasses import dataclass
from functools import cache
from typing import Any

from ojs_adapters import JobError
from tests.brokers import AMQP_URL, REDIS_URL

#: Markup in every error message: the console must show it, never run it.
MARKUP = '<script>window.__xss = 1</script><img src=x onerror="window.__xss = 2">'
#: Job numbers whose next run succeeds (set by the tests; read in the workers).
HEALED: set[int] = set()
#: Runs of each job number (in the workers, which run in the test process).
RUNS: Counter[int] = Counter()
_LOCK = threading.Lock()
#: Seconds over which a cell's retries are parked (the default, 60, would leave ``brisk``
#: waiting in a worker).
PARK_AFTER = 2

DOOMED_POLICY = {"max_attempts": 2, "initial_interval": "PT0.1S", "jitter": False,
                 "on_exhaustion": "dead_letter"}
SLOW_POLICY = {"max_attempts": 3, "initial_interval": "PT120S", "jitter": False,
               "on_exhaustion": "dead_letter"}
BRISK_POLICY = {**SLOW_POLICY, "initial_interval": "PT8S"}


@dataclass(frozen=True)
class Cell:
    """One framework on one broker, with names of its own."""

    framework: str
    kind: str  # "redis" or "amqp"
    prefix: str

    @property
    def queue(self) -> str:
        return f"{self.prefix}-q"

    @property
    def spec(self) -> str:
        return f"{self.framework}:{self.kind}:{self.prefix}"

    @classmethod
    def parse(cls, spec: str) -> Cell:
        framework, kind, prefix = spec.split(":", 2)
        return cls(framework, kind, prefix)


def fail_unless_healed(n: int, error_type: str) -> str:
    with _LOCK:
        RUNS[n] += 1
        if n in HEALED:
            return "ok"
    raise JobError(error_type, f"job {n} failed: {MARKUP}")


@cache
def celery_app_for(cell: Cell) -> Any:
    from celery import Celery

    from celery_ext import OjsTask

    broker = REDIS_URL if cell.kind == "redis" else AMQP_URL
    app = Celery(cell.prefix, broker=broker, backend=REDIS_URL, set_as_current=False,
                 task_cls=OjsTask)
    options = {"global_keyprefix": cell.prefix + ":"} if cell.kind == "redis" else {}
    app.conf.update(broker_transport_options=options, task_default_queue=cell.queue,
                    result_backend_transport_options={"global_keyprefix": cell.prefix + ":"},
                    result_expires=3600, broker_connection_retry_on_startup=True,
                    worker_hijack_root_logger=False, ojs_park_poll_interval=0.2,
                    ojs_park_after=PARK_AFTER)

    @app.task(name="web.doomed", retry_policy=DOOMED_POLICY, shared=False)  # type: ignore[untyped-decorator]
    def doomed(n: int) -> str:
        return fail_unless_healed(n, "billing.Declined")

    @app.task(name="web.slow", retry_policy=SLOW_POLICY, shared=False)  # type: ignore[untyped-decorator]
    def slow(n: int) -> str:
        return fail_unless_healed(n, "net.Timeout")

    @app.task(name="web.brisk", retry_policy=BRISK_POLICY, shared=False)  # type: ignore[untyped-decorator]
    def brisk(n: int) -> str:
        return fail_unless_healed(n, "net.Timeout")

    return app


@cache
def dramatiq_broker_for(cell: Cell) -> Any:
    import dramatiq

    from dramatiq_ext import OjsRetries
    from tests.dramatiq_ext.harness import build_broker

    broker, _client = build_broker("redis" if cell.kind == "redis" else "rabbitmq",
                                   cell.prefix, redis_url=REDIS_URL, amqp_url=AMQP_URL)
    broker.add_middleware(OjsRetries(park_after=PARK_AFTER))

    def doomed(n: int) -> str:
        return fail_unless_healed(n, "billing.Declined")

    def slow(n: int) -> str:
        return fail_unless_healed(n, "net.Timeout")

    dramatiq.actor(doomed, broker=broker, queue_name=cell.queue, actor_name="web_doomed",  # type: ignore[call-overload]
                   retry_policy=DOOMED_POLICY)
    dramatiq.actor(slow, broker=broker, queue_name=cell.queue, actor_name="web_slow",  # type: ignore[call-overload]
                   retry_policy=SLOW_POLICY)
    dramatiq.actor(slow, broker=broker, queue_name=cell.queue, actor_name="web_brisk",  # type: ignore[call-overload]
                   retry_policy=BRISK_POLICY)
    return broker


def __getattr__(name: str) -> Any:
    """``celery_app`` / ``dramatiq_broker`` of the cell ``$OJS_WEB_TEST_CELL`` names."""
    if name not in ("celery_app", "dramatiq_broker"):
        raise AttributeError(name)
    cell = Cell.parse(os.environ["OJS_WEB_TEST_CELL"])
    return celery_app_for(cell) if name == "celery_app" else dramatiq_broker_for(cell)
