"""Publishing a dead letter: the original task message, plus its history, on a real queue.

Celery's ``Reject(requeue=False)`` deletes the message on the Redis and memory
transports, and on RabbitMQ a dead-letter exchange would mean redeclaring the
user's queue with new arguments (PRECONDITION_FAILED for existing
deployments). So the adapter publishes the dead letter itself, the same way
on every transport: the original body (bytes untouched), headers and
properties, to ``<queue>.dead_letter`` (a plain durable queue on the default
exchange, declared if missing), with a publisher confirm on AMQP, tried in place
on backend errors (``_handoff``: 5 tries from 100 ms). The caller acks the
original only after this returns.

Headers added: ``ojs-dead-letter`` (the job record as JSON: attempts, errors,
countdowns, outcome) and the ``x-ojs-error-code``, ``x-ojs-error-message``,
``x-ojs-error-details`` and ``x-ojs-attempt`` headers of ojs-errors.md section
5.3 (ERR-008; ``x-ojs-attempt`` is the last attempt that ran). The original
``ojs`` header is left as it was; the original copy's ``ojs-token`` is dropped.
"""

from __future__ import annotations

import json
from typing import Any

from kombu.entity import Queue

from celery_ext._handoff import (
    TOKEN_HEADER,
    confirming_connection,
    confirms,
    pooled_producer,
    with_retry,
)
from ojs_adapters import JobRecord
from ojs_adapters.runtime.handoff import error_headers

#: Header carrying the job record on a dead-lettered message.
DEAD_LETTER_HEADER = "ojs-dead-letter"
#: Message properties copied from the original.
_COPIED_PROPERTIES = ("priority", "correlation_id", "reply_to")


def publish_dead_letter(app: Any, message: Any, queue_name: str,
                        record: JobRecord | None) -> None:
    """Publish ``message`` (a kombu ``Message``) to ``queue_name``; raise if it did not land.

    With ``record``, the dead letter carries it and the ``x-ojs-*`` headers; without, it
    goes as it came (when the full one cannot be published for a non-broker reason).
    """
    headers = {k: v for k, v in (message.headers or {}).items() if k != TOKEN_HEADER}
    if record is not None:
        headers[DEAD_LETTER_HEADER] = json.dumps(record.to_dict(), separators=(",", ":"))
        if record.errors:
            headers.update(error_headers(record.errors[-1], record.attempt))
    properties = message.properties or {}
    extra = {k: properties[k] for k in _COPIED_PROPERTIES if properties.get(k) is not None}
    queue = Queue(queue_name, routing_key=queue_name, durable=True,  # type: ignore[no-untyped-call]
                  auto_delete=False)

    def publish_once() -> None:
        if confirms(app):
            with confirming_connection(app) as conn:
                publish(conn.Producer())
        else:  # no confirms to wait for: the app's own producer pool
            with pooled_producer(app) as producer:
                publish(producer)

    def publish(producer: Any) -> None:
        producer.publish(
            message.body, exchange="", routing_key=queue_name,
            content_type=message.content_type, content_encoding=message.content_encoding,
            headers=headers, delivery_mode=2, declare=[queue], retry=False, **extra,
        )

    with_retry(app, publish_once, operation="publish dead letter")
