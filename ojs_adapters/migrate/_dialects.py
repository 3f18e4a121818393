"""The dialects ``ojs-retry migrate --from`` reads: each one's translator and option names.

>>> sorted(DIALECTS)[:3], DIALECTS["dramatiq"].translate.__name__
(['bullmq', 'celery', 'dramatiq'], 'from_dramatiq')
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ojs_adapters.migrate._model import Migration
from ojs_adapters.migrate.bullmq import from_bullmq
from ojs_adapters.migrate.celery import from_celery
from ojs_adapters.migrate.dramatiq import from_dramatiq, unlike_dramatiq
from ojs_adapters.migrate.faktory import from_faktory
from ojs_adapters.migrate.queue_backoff import from_queue_backoff
from ojs_adapters.migrate.sidekiq import from_sidekiq
from ojs_adapters.migrate.temporal import from_temporal

#: A dialect's ``from_<dialect>`` function.
Translate = Callable[..., Migration]


@dataclass(frozen=True)
class Dialect:
    """A source dialect: its translator, what it accepts, and its option names."""

    translate: Translate
    options: frozenset[str]
    suffixes: tuple[str, ...] = (".json", ".yaml", ".yml")
    takes_version: bool = False
    takes_cap: bool = False
    #: Why a scanned file's job options are not this dialect's (``None``: they are); a
    #: directory scan passes such a file over. Unset: any job-like mapping counts.
    unlike: Callable[[Mapping[Any, Any]], str | None] | None = None


#: Every dialect ``ojs-retry migrate --from`` knows, as data.
DIALECTS: dict[str, Dialect] = {
    "sidekiq": Dialect(from_sidekiq, frozenset({"retry", "dead", "retry_for", "sidekiq_retry_in",
                                                "retry_in", "max_retries", "queue"}),
                       (".json", ".yaml", ".yml", ".rb"), takes_version=True),
    "faktory": Dialect(from_faktory, frozenset({"retry", "jid", "jobtype", "args", "queue"}),
                       takes_version=True),
    "celery": Dialect(from_celery, frozenset({"max_retries", "default_retry_delay",
                                              "autoretry_for", "dont_autoretry_for",
                                              "retry_backoff", "retry_backoff_max",
                                              "retry_jitter", "retry_kwargs"}), takes_cap=True),
    "dramatiq": Dialect(from_dramatiq, frozenset({"max_retries", "min_backoff", "max_backoff",
                                                  "retry_when", "throws",
                                                  "on_retry_exhausted"}), takes_cap=True,
                        takes_version=True, unlike=unlike_dramatiq),
    "bullmq": Dialect(from_bullmq, frozenset({"attempts", "backoff", "removeOnFail"})),
    "temporal": Dialect(from_temporal, frozenset({
        "initialInterval", "backoffCoefficient", "maximumInterval", "maximumAttempts",
        "nonRetryableErrorTypes", "initial_interval", "backoff_coefficient", "maximum_interval",
        "maximum_attempts", "non_retryable_error_types", "scheduleToCloseTimeout",
        "schedule_to_close_timeout"}), takes_cap=True),
    "queue": Dialect(from_queue_backoff, frozenset({"MaxRetries", "RetryBackoffBaseMS",
                                                    "RetryBackoffMaxMS", "max_retries",
                                                    "retry_backoff_base_ms",
                                                    "retry_backoff_max_ms", "BaseMS", "MaxMS"})),
}
