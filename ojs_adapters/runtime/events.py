"""Instrumentation hooks: adapters report every decision here, hooks turn it into logs or metrics.

Both adapters call ``emit`` once per decision they execute, so the same hooks see
Celery and Dramatiq alike. Hooks are plain callables; a failing hook is logged
and never breaks the job. The structured log hook (``ojs_adapters.runtime.logs``) is on
by default; Prometheus metrics (``ojs_adapters.runtime.metrics``) are opt-in.

>>> seen = []
>>> add_hook(seen.append)
>>> remove_hook(seen.append)
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from ojs_adapters.decision import Decision

#: Which framework executed the decision.
Framework = Literal["celery", "dramatiq"]

_log = logging.getLogger("ojs_adapters.events")


@dataclass(frozen=True, slots=True)
class DecisionEvent:
    """One executed decision, with the job's identity (never its arguments).

    ``idempotency_key`` and ``dependency`` (the retry budget's name, if any) are
    what R-10 asks every retry log to carry besides the attempt and backoff.
    """

    framework: Framework
    job_id: str
    task: str
    queue: str
    max_attempts: int
    decision: Decision
    idempotency_key: str | None = None
    dependency: str | None = None


#: A hook receives every ``DecisionEvent``.
DecisionHook = Callable[[DecisionEvent], None]

#: Registry of installed hooks, called in order.
HOOKS_REGISTRY: list[DecisionHook] = []


def add_hook(hook: DecisionHook) -> None:
    """Install ``hook`` (once; adding it again does nothing)."""
    if hook not in HOOKS_REGISTRY:
        HOOKS_REGISTRY.append(hook)


def remove_hook(hook: DecisionHook) -> None:
    """Remove ``hook`` if installed."""
    if hook in HOOKS_REGISTRY:
        HOOKS_REGISTRY.remove(hook)


def emit(event: DecisionEvent) -> None:
    """Hand ``event`` to every hook; a hook's exception is logged, not raised."""
    for hook in tuple(HOOKS_REGISTRY):
        try:
            hook(event)
        except Exception:  # instrumentation must never fail a job
            _log.exception("ojs decision hook %r failed", hook)
