"""The Dramatiq console's filter on raw dead-letter messages: actor, error type and ids
read from a message's bytes where they say a field plainly, decoded only otherwise.

Read on Redis, where a filtered page tests each ``.XQ`` message before decoding it
(``_console``); ``may_match`` is the decoded reading the raw one must agree with.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timezone
from fnmatch import fnmatchcase

from ojs_adapters.runtime.dlq import DeadLetter, DeadLetterFilter
from ojs_adapters.runtime.raw_fields import raw_error_type, raw_string


def passes(data: bytes, filters: DeadLetterFilter) -> bool:
    """The filter on actor, error type and ids, read from the raw message's bytes where
    they say a field plainly (``raw_string``: no decoding; the error type from option
    ``x-ojs-error-details``), else decoded. A field read that fails settles it."""
    if filters.ids is not None:
        if (message_id := raw_string(data, b"message_id")) is None:
            return may_match(data, filters)
        if message_id not in filters.ids:
            return False
    if filters.task_type is not None:
        if (actor := raw_string(data, b"actor_name")) is None:
            return may_match(data, filters)
        if not fnmatchcase(actor, filters.task_type):
            return False
    if filters.error_type is not None:
        if (error := raw_error_type(data)) is None:
            return may_match(data, filters)
        return fnmatchcase(error, filters.error_type)
    return True


def may_match(data: bytes, filters: DeadLetterFilter) -> bool:
    """The filter on actor, error type and ids, from the message JSON alone (bytes that
    hold no JSON object, another producer's, match nothing a filter names)."""
    try:
        message = json.loads(data)
    except ValueError:
        return False
    if not isinstance(message, dict):
        return False
    errors = ((message.get("options") or {}).get("ojs") or {}).get("errors") or []
    last = errors[-1] if errors and isinstance(errors[-1], Mapping) else {}
    probe = DeadLetter(id=str(message.get("message_id")), queue="",
                       task_type=str(message.get("actor_name")),
                       error_type=last.get("type"),
                       dead_lettered_at=datetime.now(timezone.utc), attempt=0)
    return DeadLetterFilter(task_type=filters.task_type, error_type=filters.error_type,
                            ids=filters.ids).matches(probe)
