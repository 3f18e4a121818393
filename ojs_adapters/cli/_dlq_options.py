"""The options every ``ojs-retry dlq`` verb shares, and their reading.

``connection_options`` (which framework and broker, ``--json``) and ``filter_options``
(which dead letters) decorate a verb; ``selection`` turns the filter options into a
``DeadLetterFilter``, ``moment`` and ``duration_option`` read a time or a duration and
name the option in a bad one's message.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import ParamSpec, TypeVar

import click

from ojs_adapters.durations import parse_duration
from ojs_adapters.errors import OjsValidationError
from ojs_adapters.history import utc_now
from ojs_adapters.runtime.dlq import DeadLetterFilter

P = ParamSpec("P")
R = TypeVar("R")


def connection_options(command: Callable[P, R]) -> Callable[P, R]:
    """The options that say which framework and broker; ``--json``."""
    for decorator in reversed((
        click.option("--framework", required=True, metavar="NAME",
                     help="celery or dramatiq (any installed ojs_adapters.runtime.dlq backend)."),
        click.option("--app", metavar="MODULE[:ATTR]",
                     help="The Celery app (read as celery -A reads it), or the Dramatiq "
                          "broker (as dramatiq does), imported from the current directory."),
        click.option("--broker", metavar="URL",
                     help="Broker URL, instead of --app; with --app, overrides Celery's "
                          "broker_url."),
        click.option("--option", "options", multiple=True, metavar="KEY=VALUE",
                     help="Framework setting. management=URL or none (the RabbitMQ "
                          "management API that lists dead-letter queues; default "
                          "http://BROKER_HOST:15672). Dramatiq: namespace=NS (Redis broker), "
                          "records=REDIS_URL and records_prefix=P (the workers' "
                          "RedisRecordStore). Celery without --app: backend=URL (the "
                          "workers' result backend, for replay)."),
        click.option("--json", "as_json", is_flag=True, help="Print one JSON document."),
    )):
        command = decorator(command)
    return command


def filter_options(command: Callable[P, R]) -> Callable[P, R]:
    """The options that select dead letters."""
    for decorator in reversed((
        click.option("--queue", help="Only this original queue (found even where the broker "
                                     "cannot list queues)."),
        click.option("--task-type", help="Task or actor name; shell patterns allowed."),
        click.option("--error-type", help="Type of the last error, e.g. 'payment.*'."),
        click.option("--since", help="Dead-lettered at or after: ISO 8601 time, or a duration ago "
                                     "(P1D)."),
        click.option("--until", help="Dead-lettered before: ISO 8601 time, or a duration ago."),
    )):
        command = decorator(command)
    return command


def moment(value: str | None, name: str) -> datetime | None:
    """``--since``/``--until``: an ISO 8601 time (UTC if it names no zone), or a duration ago."""
    if value is None:
        return None
    try:
        if value.startswith("P"):
            return utc_now() - duration_option(value, name)
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except (ValueError, OverflowError):
        raise click.BadParameter(f"{value!r} is neither an ISO 8601 time "
                                 "(2026-11-27T10:00:00Z) nor a duration ago (P1D, PT6H)",
                                 param_hint=f"'--{name}'") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def duration_option(value: str, option: str) -> timedelta:
    """``value`` as a duration, an error naming the option (not a retry policy field)."""
    try:
        return parse_duration(value, field=option)
    except OjsValidationError:
        raise click.BadParameter(f"{value!r} is not an ISO 8601 duration (PnDTnHnMnS, "
                                 "e.g. P7D or PT6H)", param_hint=f"'--{option}'") from None


def selection(queue: str | None, task_type: str | None, error_type: str | None,
              since: str | None, until: str | None,
              ids: tuple[str, ...] = ()) -> DeadLetterFilter:
    """The dead letters the filter options (and job ids) select."""
    return DeadLetterFilter(queue=queue, task_type=task_type, error_type=error_type,
                            since=moment(since, "since"), until=moment(until, "until"),
                            ids=frozenset(ids) if ids else None)
