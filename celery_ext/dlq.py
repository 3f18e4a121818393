"""Dead-letter management for Celery: ``runtime.dlq`` over the ``<queue>.dead_letter`` queues.

An ``OjsTask`` dead-letters the original task message (body untouched) with its
job record in the ``ojs-dead-letter`` header (``_deadletter``), so each message
there is a ``DeadLetter`` as it stands. Replay publishes the original body back to
its queue with fresh OJS headers (attempt 1, the full history kept, Celery's
``retries`` and ``eta`` cleared, the last run's ``x-ojs-*`` and ``ojs-token``
dropped, the idempotency key kept) plus the header ``ojs-replay``
(``{"replay_count", "last_replayed_at"}``, carried on by every later retry and
dead letter), stamps the job record first, and removes *that* dead message in
the same atomic step:

- Redis: one Lua script moves the exact list element to the queue's list;
- RabbitMQ: publish and ack commit in one AMQP transaction;
- ``memory://``: in process, one step.

The record must be reset before the replayed message runs: a worker that found
the old terminal record at attempt 1 would take the replay for a duplicate.

>>> from celery import Celery
>>> from ojs_adapters.runtime.dlq import DeadLetterFilter
>>> app = Celery("demo", broker="memory://", backend="cache+memory://")
>>> dlq = dead_letter_queue(app, queues=["dlq-doctest-emails"])  # memory:// is per process
>>> dlq.list(DeadLetterFilter(queue="dlq-doctest-emails")).total
0
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any

from celery_ext._dlq_common import (
    JobRecords,
    app_queues,
    dead_letter_of,
    dead_letter_queues,
    dead_letter_templates,
    refuse_dead_letter_queues,
    replay_headers,
)
from celery_ext._dlq_kombu import KombuDeadLetters
from celery_ext._dlq_redis import RedisDeadLetters
from ojs_adapters.runtime.dlq import REPLAY_HEADER, DeadLetters, named_module_hint, replay_info

#: The ``options`` keys ``open_dead_letter_queue`` reads (``ojs-retry dlq --option``).
OPTION_KEYS = ("backend", "management")

# The helpers the broker stores share live in ``_dlq_common`` (the header and its
# reader in ``ojs_adapters.runtime.dlq``); kept importable from here.
__all__ = [
    "REPLAY_HEADER",
    "JobRecords",
    "app_queues",
    "dead_letter_of",
    "dead_letter_queue",
    "dead_letter_queues",
    "dead_letter_templates",
    "open_dead_letter_queue",
    "replay_headers",
    "replay_info",
]


def dead_letter_queue(app: Any, *, queues: Sequence[str] = (), discover: bool = False,
                      management: str | None = None,
                      records: JobRecords | None = None) -> DeadLetters:
    """The dead letters of Celery ``app``'s queues (configured, default, routed) plus ``queues``.

    On Redis the dead-letter queues of other queues are found too (by key pattern).
    On RabbitMQ, with ``discover``, also those the management API lists
    (``management``: its URL, default beside the broker; ``"none"`` skips it);
    ``coverage()`` tells which. ``records``: where replays are stamped (default:
    the app's result backend).
    """
    records = records or JobRecords(app)
    with app.connection_for_write() as conn:
        transport = conn.transport.driver_type
    if transport in ("redis", "rediss"):
        return DeadLetters(RedisDeadLetters(app, queues, records))
    return DeadLetters(KombuDeadLetters(app, queues, records, discover=discover,
                                        management=management))


def open_dead_letter_queue(*, app: str | None = None, broker: str | None = None,
                           queues: Sequence[str] = (),
                           options: Mapping[str, str] | None = None) -> DeadLetters:
    """The ``runtime.dlq`` entry point: ``app`` names the Celery app, as ``celery -A`` does.

    ``app`` (``module:attr``, or ``module`` for its ``app``/``celery`` attribute) is
    imported from the current directory, with the modules the app's ``include``
    and ``imports`` name (as a worker does, so every task's queue is known).
    ``broker`` (a URL) overrides its ``broker_url``; job records are updated in
    its result backend. Without ``app``, a bare app on ``broker`` looks in
    ``celery.dead_letter`` and whatever else it finds; replay then needs
    ``options["backend"]``, the workers' result backend. ``options["management"]``:
    the RabbitMQ management API's URL, or ``none``. A dead-letter queue's own name in
    ``queues`` raises ``DeadLetterQueueGiven``.
    """
    options = options or {}
    records: JobRecords | None = None
    if app:
        found = _app_named(app)
    elif broker:
        from celery import Celery

        found = Celery("ojs-retry", broker=broker, backend=options.get("backend"),
                       set_as_current=False)
        records = JobRecords(found, reachable=bool(options.get("backend")))
    else:
        raise ValueError("give --app module[:app] (the Celery app) or --broker URL")
    if broker:
        found.conf.broker_url = broker
    refuse_dead_letter_queues(queues, dead_letter_templates(found))
    opened = dead_letter_queue(found, queues=queues, discover=True, records=records,
                               management=options.get("management"))
    with found.connection_for_write() as conn:  # where it is, for messages (not connected)
        opened.broker_url = str(conn.as_uri(mask="***"))
    return opened


def _app_named(app: str) -> Any:
    """The Celery app ``app`` names, found the way ``celery -A`` finds it."""
    from celery.app.utils import find_app
    from celery.utils.imports import cwd_in_path

    module, _, attribute = app.partition(":")
    with cwd_in_path(), named_module_hint(module, last_may_be_attribute=not attribute):
        if attribute and module:  # Celery says "No module named 'app:nope'" for a bad name
            name = attribute.split(".", 1)[0]
            if not hasattr(importlib.import_module(module), name):
                raise AttributeError(f"module {module!r} has no attribute {name!r}")
        found = find_app(app)
        if not hasattr(found, "connection_for_write") or not hasattr(found, "conf"):
            raise TypeError(f"{app} is {type(found).__name__}, not a Celery app")
        found.loader.import_default_modules()
    return found
