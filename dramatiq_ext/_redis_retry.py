"""A retry on a ``RedisBroker`` whose job records live in the broker's Redis: one script.

The ``retryable`` record, already marked handed off, is saved and the successor enqueued
as ``dispatch.lua``'s ``enqueue`` does it (``HSET <ns>:<queue>.msgs``, ``RPUSH
<ns>:<queue>``, on ``<queue>.DQ`` when delayed), atomically. So the record says "handed
off" exactly when the retry is on the broker: the save before the publish and the mark
after it (three round trips) become one, and no crash falls between them
(docs/cost.md). Dramatiq's ``enqueue`` hooks run around it as around ``broker.enqueue``.
"""

from __future__ import annotations

from typing import Any

from dramatiq.broker import Broker
from dramatiq.common import current_millis, dq_name
from dramatiq.message import Message

from dramatiq_ext._handoff import is_redis
from ojs_adapters import JobRecord
from ojs_adapters.runtime.group_commit import run_script
from ojs_adapters.runtime.handoff import ORDERED_SAVE_BODY, SAVE_ARGC
from ojs_adapters.runtime.tokens import new_token

#: KEYS[1] the record, KEYS[2] the queue's message hash, KEYS[3] the queue; ARGV the
#: ordered save's (``ORDERED_SAVE_BODY``, ``SAVE_ARGC`` of them), then the Redis message id
#: and the body. The retry is enqueued whatever the save finds (a later attempt is kept).
_ENQUEUE_AND_SAVE = f"""
redis.call("HSET", KEYS[2], ARGV[{SAVE_ARGC + 1}], ARGV[{SAVE_ARGC + 2}])
redis.call("RPUSH", KEYS[3], ARGV[{SAVE_ARGC + 1}])
""" + ORDERED_SAVE_BODY


def shares_redis(broker: Broker, store: Any) -> bool:
    """Whether ``store`` keeps its records in ``broker``'s own Redis (one script can do both)."""
    client = getattr(broker, "client", None)
    return client is not None and getattr(store, "client", None) is client and \
        hasattr(store, "save_call") and hasattr(broker, "namespace") and is_redis(broker)


def enqueue_with_record(broker: Any, store: Any, message: Message[Any], delay: int | None,
                        record: JobRecord) -> None:
    """Enqueue ``message`` (its copy token set) after ``delay`` ms and save ``record`` in one
    script; the caller checked ``shares_redis``. Errors propagate (nothing was written, or
    all was: the script is atomic)."""
    message = message.copy(options={"redis_message_id": new_token()})
    queue = message.queue_name
    if delay is not None:
        queue = dq_name(queue)
        message = message.copy(queue_name=queue, options={"eta": current_millis() + delay})
    broker.emit_before("enqueue", message, delay)
    key, save_args = store.save_call(record.id, record.to_dict())
    full = f"{broker.namespace}:{queue}"
    run_script(broker.client, _ENQUEUE_AND_SAVE, [key, f"{full}.msgs", full],
               [*save_args, message.options["redis_message_id"], message.encode()])
    broker.emit_after("enqueue", message, delay)
