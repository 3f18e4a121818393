"""Dead letters on a ``RedisBroker``, written in place: Dramatiq's nack moves them to ``.XQ``.

Dramatiq's nack moves the message body *stored* in ``<ns>:<queue>.msgs`` to
``<queue>.XQ`` (``dispatch.lua``), and that body predates the last attempt's
history. So the dead-letter copy (the whole history, the ``dead_letter`` mark in
``_state``) replaces the stored body, in the same script as the record's save when
the records live in the broker's Redis; then the message is failed, and Dramatiq's
own nack puts the copy in ``.XQ``. One round trip besides the nack, where publishing
a copy and failing that cost four (docs/cost.md).

If the nack is lost (the worker dies first), the broker redelivers the replaced body:
its ``dead_letter`` mark fails it again, unrun (``OjsRetries.before_process_message``).
"""

from __future__ import annotations

from typing import Any

from dramatiq.common import q_name

from ojs_adapters import JobRecord
from ojs_adapters.runtime.group_commit import run_script
from ojs_adapters.runtime.handoff import ORDERED_SAVE_BODY, SAVE_ARGC

#: KEYS[1] the queue's message hash; ARGV[1] the message's Redis id, ARGV[2] the new body.
#: -1 if the message is no longer stored there (then nothing is written), else 1.
_REPLACE = """
if redis.call("HEXISTS", KEYS[1], ARGV[1]) == 0 then return -1 end
redis.call("HSET", KEYS[1], ARGV[1], ARGV[2])
return 1
"""
#: The same, then the ordered save of the record (``ORDERED_SAVE_BODY``): KEYS[1] the
#: record, KEYS[2] the message hash; ARGV the save's (``SAVE_ARGC`` of them), then the
#: Redis id and the new body.
_REPLACE_AND_SAVE = f"""
if redis.call("HEXISTS", KEYS[2], ARGV[{SAVE_ARGC + 1}]) == 0 then return -1 end
redis.call("HSET", KEYS[2], ARGV[{SAVE_ARGC + 1}], ARGV[{SAVE_ARGC + 2}])
""" + ORDERED_SAVE_BODY


def dead_letter_in_place(broker: Any, store: Any, message: Any, dead: Any,
                         record: JobRecord) -> bool | None:
    """Replace ``message``'s stored body with the dead-letter copy ``dead`` (a ``Message``).

    ``True``: replaced, and ``record`` saved in the same call; ``False``: replaced, the
    record is the caller's to save; ``None``: not possible here (not a ``RedisBroker``
    delivery, or the body is gone): publish a copy instead. Store errors propagate.
    """
    redis_id = message.options.get("redis_message_id")
    client = getattr(broker, "client", None)
    if redis_id is None or client is None or not hasattr(broker, "namespace"):
        return None
    messages = f"{broker.namespace}:{q_name(message.queue_name)}.msgs"
    body = dead.encode()
    if getattr(store, "client", None) is client and hasattr(store, "save_call"):
        key, save_args = store.save_call(record.id, record.to_dict())
        done = run_script(client, _REPLACE_AND_SAVE, [key, messages],
                          [*save_args, redis_id, body])
        return None if done == -1 else True
    done = run_script(client, _REPLACE, [messages], [redis_id, body])
    return None if done == -1 else False
