"""The console's index of retries parked in the RabbitMQ delay levels (``_waiting``).

AMQP can count the delay levels' TTL queues but not list them, so the worker that
parks a retry there (``_parking_rabbitmq``) also notes it, one round trip, in the
sorted set ``<result key prefix>_ojs.parked`` on the Redis result backend, scored
by due time; members as in the Redis parked set: ``<len>:<queue><envelope>``. With
no Redis result backend there is no index (and the console says so).
"""

from __future__ import annotations

import base64
import logging
from typing import Any

from kombu.utils.json import dumps

from celery_ext._parking_redis import PARKED_KEY
from celery_ext.records import RecordStore
from ojs_adapters.runtime import browse

logger = logging.getLogger("celery_ext")

#: Message properties an indexed envelope keeps (and the copy *retry now* publishes).
COPIED_PROPERTIES = ("priority", "correlation_id", "reply_to", "delivery_mode")


def index_key(app: Any) -> bytes | None:
    """The RabbitMQ parked-retry index of ``app`` (``None`` without a Redis result backend)."""
    return app.backend.get_key_for_task(PARKED_KEY) if RecordStore(app.backend).leases \
        else None


def index_parked(app: Any, message: Any, queue: str, due: float) -> None:
    """Note an AMQP ``message`` parked for ``queue`` until ``due`` in the index (one round
    trip); a failure is logged, never raised: the retry is parked already."""
    try:
        if (key := index_key(app)) is None:
            return
        props, body = dict(message.properties), message.body
        envelope = {"body": base64.b64encode(body if isinstance(body, bytes) else
                                             str(body).encode()).decode(),
                    "content-encoding": props.get("content_encoding"),
                    "content-type": props.get("content_type"),
                    "headers": props.get("application_headers") or {},
                    "properties": {k: props[k] for k in COPIED_PROPERTIES
                                   if props.get(k) is not None}}
        payload: str = dumps(envelope)  # type: ignore[no-untyped-call]  # as ``_parking``
        browse.add_to_index(app.backend.client, key, f"{len(queue.encode())}:{queue}{payload}", due)
    except Exception:
        logger.warning("ojs-adapters: cannot note a parked retry in the console's index",
                       exc_info=True)
