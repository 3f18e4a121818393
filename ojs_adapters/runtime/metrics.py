"""Optional Prometheus metrics for retry decisions (the ``metrics`` extra: prometheus-client).

Nothing here runs unless ``enable_metrics()`` is called, so a process without the
extra pays nothing. The names are the same from both frameworks:
``ojs_retry_attempts_total{task,queue,attempt}``, ``ojs_retry_exhausted_total{task,queue}``,
``ojs_dead_letter_total{queue}``, ``ojs_discarded_total{reason}`` (discard, fail,
non_retryable, exhausted), the ``ojs_retry_backoff_seconds`` histogram, and the
``ojs_retry_budget_utilization_ratio{dependency}`` gauge (retries in the window over
those the budget allows, read from every ``RetryBudgets`` at scrape time; R-7).
``serve_metrics(port)`` serves them, summed over forked worker processes when
prometheus-client's multiprocess mode is on (``PROMETHEUS_MULTIPROC_DIR``).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from typing import Any

from ojs_adapters.errors import OjsResourceError, OjsValidationError
from ojs_adapters.runtime import events
from ojs_adapters.runtime.budget import BUDGETS_REGISTRY

#: prometheus-client's switch to multiprocess mode: a directory of one file per process.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

#: Histogram buckets for backoff delays, in seconds.
BACKOFF_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 300, 900, 3600, 86400)


class PrometheusMetrics:
    """A decision hook that counts decisions in a Prometheus registry."""

    def __init__(self, registry: Any = None) -> None:
        from prometheus_client import REGISTRY, Counter, Histogram

        reg = REGISTRY if registry is None else registry
        self.attempts = Counter("ojs_retry_attempts_total", "Retries scheduled",
                                ["task", "queue", "attempt"], registry=reg)
        self.exhausted = Counter("ojs_retry_exhausted_total", "Jobs that ran out of attempts",
                                 ["task", "queue"], registry=reg)
        self.dead_letter = Counter("ojs_dead_letter_total", "Jobs moved to a dead-letter queue",
                                   ["queue"], registry=reg)
        self.discarded = Counter("ojs_discarded_total", "Jobs ended without a dead letter",
                                 ["reason"], registry=reg)
        self.backoff = Histogram("ojs_retry_backoff_seconds", "Backoff delay of each retry",
                                 buckets=BACKOFF_BUCKETS, registry=reg)
        self.budgets = BudgetCollector()
        reg.register(self.budgets)

    def __call__(self, event: events.DecisionEvent) -> None:
        d = event.decision
        if d.action == "retry":
            self.attempts.labels(event.task, event.queue, str(d.attempt + 1)).inc()
            self.backoff.observe(d.delay or 0.0)
            return
        if d.exhausted:
            self.exhausted.labels(event.task, event.queue).inc()
        if d.action == "dead_letter":
            self.dead_letter.labels(event.queue).inc()
            return
        reason = {"non_retryable": "non_retryable", "not_retryable_code": "non_retryable",
                  "exhausted": "exhausted"}.get(d.reason, d.action)
        self.discarded.labels(reason).inc()


class BudgetCollector:
    """Collects ``ojs_retry_budget_utilization_ratio`` from every live ``RetryBudgets``."""

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        gauge = GaugeMetricFamily("ojs_retry_budget_utilization_ratio",
                                  "Retries in the rolling window over the retries the budget "
                                  "allows (1 = spent)", labels=["dependency"])
        for budgets in list(BUDGETS_REGISTRY):
            for dependency, ratio in budgets.utilizations().items():
                gauge.add_metric([dependency], ratio)
        yield gauge

    def describe(self) -> Iterator[Any]:
        """No fixed description: the registry then collects lazily, at scrape time."""
        return iter(())


def _require_client() -> None:
    if importlib.util.find_spec("prometheus_client") is None:
        raise OjsResourceError(
            "metrics need prometheus-client: pip install 'ojs-adapters[metrics]'",
            code="UNSUPPORTED_FEATURE", details={"extra": "metrics"},
        )


def enable_metrics(registry: Any = None) -> PrometheusMetrics:
    """Install a ``PrometheusMetrics`` hook; a clear error if prometheus-client is missing."""
    _require_client()
    hook = PrometheusMetrics(registry)
    events.add_hook(hook)
    return hook


def serve_metrics(port: int, addr: str = "0.0.0.0") -> tuple[Any, Any]:
    """Serve ``/metrics`` on ``port`` with prometheus-client's ``start_http_server``.

    With ``PROMETHEUS_MULTIPROC_DIR`` set (forked workers: Celery's prefork pool), the
    sum of every process's files, read by prometheus-client's ``MultiProcessCollector``;
    else this process's default registry. Call it once, in the process that stays up
    (Celery: on ``worker_init``). Returns prometheus-client's ``(server, thread)``.

    >>> serve_metrics(9718)  # doctest: +SKIP
    """
    _require_client()
    from prometheus_client import CollectorRegistry, start_http_server, values

    directory = os.environ.get(MULTIPROC_ENV)
    if not directory:
        return start_http_server(port, addr)
    details = {"field": MULTIPROC_ENV, "value": directory}
    if not os.path.isdir(directory):
        raise OjsValidationError(f"{MULTIPROC_ENV}={directory} is not a directory: create it "
                                 "(empty) before the workers start", code="INVALID_ARGS",
                                 details={**details, "rule": "an existing directory"})
    if values.ValueClass is values.MutexValue:
        # prometheus-client chooses where values live once, when it is first imported.
        raise OjsValidationError(
            f"{MULTIPROC_ENV} was set after prometheus_client was imported, so this "
            "process's metrics stay in memory and no other process's are summed: set it "
            "in the environment before the workers start", code="INVALID_ARGS",
            details={**details, "rule": "set before prometheus_client is imported"})
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    return start_http_server(port, addr, registry=registry)
