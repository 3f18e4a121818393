"""Alerts on dead letters (integration standard R-8): a hook per dead letter, a depth gauge.

``on_dead_letter(hook)`` installs a callable that both adapters call once a dead
letter is on its dead-letter queue (Celery: after the publish was confirmed;
Dramatiq: as the hop is failed into ``<queue>.XQ``), with a ``DeadLetterEvent``:
the job's id, task, queue, attempt and full error history, never its arguments.
A hook runs in the worker, on the job's path: keep it quick (hand the event to a
queue or a thread if it calls out). A failing hook is logged, never raised. A job
whose dead letter is published again after a crash may be reported twice.

``DeadLetterDepth`` is a Prometheus collector of ``ojs_dead_letter_depth{framework,queue}``
(with ``ojs_dead_letter_depth_error{framework}``, 1 when the read failed, and
``ojs_dead_letter_depth_complete{framework}``, 0 when the broker could not list its
dead-letter queues so some may be missing from the depths) read at scrape
time from a function (the console's backend counts on the broker), so an alert can fire
when a queue grows: ``ojs-retry web`` serves it at ``/metrics``.

>>> seen = []
>>> hook = on_dead_letter(seen.append)
>>> remove_dead_letter_hook(hook)
>>> DEAD_LETTER_HOOKS_REGISTRY
[]
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ojs_adapters.runtime.dlq import DeadLetter
from ojs_adapters.runtime.events import Framework

_log = logging.getLogger("ojs_adapters.alerts")


@dataclass(frozen=True, slots=True)
class DeadLetterEvent:
    """A job that just landed on a dead-letter queue.

    ``letter`` is the ``ojs_adapters.runtime.dlq.DeadLetter`` (its ``payload`` left empty:
    arguments never leave the worker through a hook); ``dead_letter_queue`` the
    queue that holds it.
    """

    framework: Framework
    letter: DeadLetter
    dead_letter_queue: str
    idempotency_key: str | None = None


#: A hook receives every ``DeadLetterEvent``.
DeadLetterHook = Callable[[DeadLetterEvent], None]

#: Registry of installed dead-letter hooks, called in order.
DEAD_LETTER_HOOKS_REGISTRY: list[DeadLetterHook] = []


def on_dead_letter(hook: DeadLetterHook) -> DeadLetterHook:
    """Install ``hook`` (once); returns it, so it also works as a decorator.

    >>> @on_dead_letter
    ... def page_someone(event):
    ...     print(event.letter.queue, event.letter.error_type)
    >>> remove_dead_letter_hook(page_someone)
    """
    if hook not in DEAD_LETTER_HOOKS_REGISTRY:
        DEAD_LETTER_HOOKS_REGISTRY.append(hook)
    return hook


def remove_dead_letter_hook(hook: DeadLetterHook) -> None:
    """Remove ``hook`` if installed."""
    if hook in DEAD_LETTER_HOOKS_REGISTRY:
        DEAD_LETTER_HOOKS_REGISTRY.remove(hook)


def notify_dead_letter(event: DeadLetterEvent) -> None:
    """Hand ``event`` to every hook; a hook's exception is logged, not raised."""
    for hook in tuple(DEAD_LETTER_HOOKS_REGISTRY):
        try:
            hook(event)
        except Exception:  # an alert must never fail the job or its hand-off
            _log.exception("ojs dead-letter hook %r failed", hook)


class DeadLetterDepth:
    """Collector of ``ojs_dead_letter_depth{framework,queue}``, read at scrape time.

    ``depths`` returns ``{original queue: dead letters}``. An error while reading is
    logged, yields no depth sample, and sets ``ojs_dead_letter_depth_error{framework}``
    to 1 (0 when the read worked), so an alert can tell "no dead letters" from "not read".
    ``complete``, called after a read that worked, says whether every dead-letter queue
    was counted (``Coverage.complete``: RabbitMQ without its management API cannot list
    them); given, it is ``ojs_dead_letter_depth_complete{framework}`` (1 or 0), so a
    missing queue does not read as "no dead letters" either.

    >>> from prometheus_client import CollectorRegistry, generate_latest
    >>> registry = CollectorRegistry()
    >>> registry.register(DeadLetterDepth("celery", lambda: {"emails": 3}))
    >>> b'ojs_dead_letter_depth{framework="celery",queue="emails"} 3.0' in generate_latest(registry)
    True
    """

    def __init__(self, framework: str, depths: Callable[[], Mapping[str, int]], *,
                 complete: Callable[[], bool] | None = None) -> None:
        self.framework = framework
        self.depths = depths
        self.complete = complete

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        gauge = GaugeMetricFamily("ojs_dead_letter_depth",
                                  "Dead letters waiting in each queue's dead-letter queue",
                                  labels=["framework", "queue"])
        error = GaugeMetricFamily("ojs_dead_letter_depth_error",
                                  "1 if the last read of the dead-letter depths failed",
                                  labels=["framework"])
        try:
            found = dict(self.depths())
        except Exception:
            _log.exception("cannot read the dead-letter depths")
            found = None
        for queue, depth in sorted((found or {}).items()):
            gauge.add_metric([self.framework, queue], depth)
        error.add_metric([self.framework], 0 if found is not None else 1)
        yield gauge
        yield error
        if self.complete is not None and found is not None:
            complete = GaugeMetricFamily(
                "ojs_dead_letter_depth_complete",
                "1 if every dead-letter queue was counted; 0 if the broker could not list "
                "them (RabbitMQ without its management API) and some may be missing",
                labels=["framework"])
            complete.add_metric([self.framework], 1 if self.complete() else 0)
            yield complete

    def describe(self) -> Iterator[Any]:
        """No fixed description: the registry collects lazily, at scrape time."""
        return iter(())
