"""Which queue a delivery came from, and the name of its dead-letter queue.

Celery's request keeps the delivery's exchange and routing key, not the
queue's name; the worker's queue table maps them back (for the usual
``apply_async(queue=...)`` routing the routing key *is* the queue name).

>>> dead_letter_queue_name("emails", None)
'emails.dead_letter'
>>> dead_letter_queue_name("emails", "dlq.{queue}")
'dlq.emails'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: App setting: template of dead-letter queue names; ``{queue}`` is the task's queue.
DEAD_LETTER_SETTING = "ojs_dead_letter_queue"
#: Default template of dead-letter queue names.
DEFAULT_DEAD_LETTER_QUEUE = "{queue}.dead_letter"


def queue_of(app: Any, delivery_info: Mapping[str, Any] | None) -> str:
    """The name of the queue a message was delivered from (best effort)."""
    info = delivery_info or {}
    exchange, routing_key = info.get("exchange"), info.get("routing_key")
    for queue in app.amqp.queues.values():
        if queue.routing_key == routing_key and (
                not exchange or (queue.exchange is not None and queue.exchange.name == exchange)):
            return str(queue.name)
    return str(routing_key or app.conf.task_default_queue)


def dead_letter_queue_name(queue: str, template: str | None) -> str:
    """``template`` (default ``{queue}.dead_letter``) filled in for ``queue``."""
    return (template or DEFAULT_DEAD_LETTER_QUEUE).format(queue=queue)


def dead_letter_queue_for(task: Any, queue: str) -> str:
    """The dead-letter queue of ``task``'s messages from ``queue``.

    The task's ``dead_letter_queue`` wins over ``app.conf.ojs_dead_letter_queue``.
    """
    template = getattr(type(task), "dead_letter_queue", None) or task.app.conf.get(
        DEAD_LETTER_SETTING)
    return dead_letter_queue_name(queue, template)
