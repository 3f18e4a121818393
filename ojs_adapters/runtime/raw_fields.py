"""One field of a raw JSON message, read from its bytes without decoding the message.

A console filter over 10,000 dead letters reads one field of each; decoding every
message would cost the page. Each reader answers ``None`` (decode the message then)
when the bytes do not say the field plainly.
"""

from __future__ import annotations

import json

from ojs_adapters.runtime.dlq import DeadLetterFilter
from ojs_adapters.runtime.handoff import ERROR_DETAILS_HEADER


def needles(filters: DeadLetterFilter) -> list[bytes]:
    """Literal text every raw message matching ``filters``' task and error patterns
    contains (a pattern's part before a wildcard, JSON-escaped): a cheap test before
    reading fields.

    >>> needles(DeadLetterFilter(task_type="billing.*", error_type="*"))
    [b'billing.']
    """
    out = []
    for pattern in (filters.task_type, filters.error_type):
        literal = (pattern or "").split("*")[0].split("?")[0].split("[")[0]
        if literal:
            out.append(json.dumps(literal)[1:-1].encode())
    return out


def raw_string(raw: bytes, key: bytes, *, escaped: bool = False) -> str | None:
    """The string value of the JSON key ``key`` in the JSON text ``raw``, read without
    decoding it (a filter over 10,000 messages reads one field of each, not the whole).

    ``escaped``: the key sits in a JSON text that is itself a string value (``\\"key\\":``).
    ``None`` (decode the text then) unless ``key`` occurs exactly once and its value is a
    string that needs no unescaping.

    >>> raw_string(b'{"task": "a.b", "x": {"k": 1}}', b"task"), raw_string(b'{"k": 1}', b"k")
    ('a.b', None)
    >>> raw_string(b'{"h": "{\\\\"at\\\\":\\\\"2026\\\\"}"}', b"at", escaped=True)
    '2026'
    """
    quote = b'\\"' if escaped else b'"'
    needle = quote + key + quote + b":"
    at = raw.find(needle)
    if at < 0 or raw.find(needle, at + 1) >= 0 or raw[at - 1:at] == b"\\":
        return None
    start = at + len(needle)
    if raw[start:start + 1] == b" ":
        start += 1
    if raw[start:start + len(quote)] != quote:
        return None
    start += len(quote)
    end = raw.find(quote, start)
    value = raw[start:end]
    if end < 0 or b"\\" in value:
        return None
    try:
        return value.decode()
    except UnicodeDecodeError:
        return None


def raw_error_type(raw: bytes) -> str | None:
    """The last error's type in a raw message that carries the ``x-ojs-error-details``
    header (Celery) or option (Dramatiq), read as ``raw_string`` reads; else ``None``.

    >>> raw_error_type(b'{"x-ojs-error-details": "{\\\\"type\\\\":\\\\"net.Down\\\\"}"}')
    'net.Down'
    """
    needle = b'"' + ERROR_DETAILS_HEADER.encode() + b'":'
    at = raw.find(needle)
    if at < 0 or raw.find(needle, at + 1) >= 0:
        return None
    start = at + len(needle)
    if raw[start:start + 1] == b" ":
        start += 1
    head = b'"{\\"type\\":\\"'
    if raw[start:start + len(head)] != head:
        return None
    start += len(head)
    end = raw.find(b'\\"', start)
    value = raw[start:end]
    return None if end < 0 or b"\\" in value else value.decode(errors="replace")
