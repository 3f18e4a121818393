"""One structured log record per executed retry decision (R-9, R-10 of the integration standard).

Records go to the ``ojs_adapters.retry`` logger: retries at INFO, exhaustion and
dead letters at WARNING. Each carries ``extra={"ojs": {...}}`` with the job id as
correlation id, the task type, the idempotency key and retry-budget dependency
(when set), attempt, max_attempts, backoff_ms, error type and
code, and the decision. Job arguments and payloads are never logged; exception
messages only when asked for (``LogDecisions(include_messages=True)``).

>>> from ojs_adapters.runtime import events
>>> DEFAULT_LOG_HOOK in events.HOOKS_REGISTRY
True
"""

from __future__ import annotations

import logging
from typing import Any

from ojs_adapters.runtime.events import DecisionEvent, add_hook

#: The logger every decision record goes to.
logger = logging.getLogger("ojs_adapters.retry")


class LogDecisions:
    """A decision hook that logs one structured record per decision.

    >>> from ojs_adapters.runtime import events
    >>> events.remove_hook(DEFAULT_LOG_HOOK)
    >>> events.add_hook(LogDecisions(include_messages=True))  # opt in to error messages
    >>> events.HOOKS_REGISTRY[:] = [DEFAULT_LOG_HOOK]
    """

    def __init__(self, *, include_messages: bool = False) -> None:
        self.include_messages = include_messages

    def __call__(self, event: DecisionEvent) -> None:
        d = event.decision
        level = logging.WARNING if d.action == "dead_letter" or d.exhausted else logging.INFO
        if not logger.isEnabledFor(level):
            return
        fields: dict[str, Any] = {
            "correlation_id": event.job_id,
            "framework": event.framework,
            "task": event.task,
            "queue": event.queue,
            "attempt": d.attempt,
            "max_attempts": event.max_attempts,
            "backoff_ms": None if d.delay is None else round(d.delay * 1000),
            "error_type": d.entry.type,
            "error_code": d.entry.code,
            "handler_code": d.entry.handler_code,
            "decision": d.action,
            "reason": d.reason,
            "idempotency_key": event.idempotency_key,
            "dependency": event.dependency,
        }
        if self.include_messages:
            fields["error_message"] = d.entry.message
        text = " ".join(f"{k}={v}" for k, v in fields.items() if v is not None)
        logger.log(level, "ojs retry decision %s", text, extra={"ojs": fields})


#: The hook installed by default.
DEFAULT_LOG_HOOK = LogDecisions()
add_hook(DEFAULT_LOG_HOOK)
