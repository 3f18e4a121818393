"""Celery dead letters on Redis: the kombu lists ``<prefix><queue>.dead_letter[<sep><pri>]``.

kombu keeps a Redis queue as a list of JSON envelopes (``body`` base64, ``headers``,
``properties`` with ``delivery_info``, ``delivery_tag`` and ``priority``), one list
per priority step, every key behind the transport's ``global_keyprefix``. Reading
is ``LRANGE`` (nothing is taken), and a replay moves the exact envelope with one
Lua script: remove it from the dead-letter list, push the copy where kombu's own
``_put`` would. A dead message gone meanwhile (replayed or removed) is skipped.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Sequence
from typing import Any, NamedTuple

from celery_ext._dlq_common import (
    JobRecords,
    dead_letter_of,
    dead_letter_queues,
    dead_letter_templates,
    replay_headers,
    shared,
)
from ojs_adapters.runtime.dlq import Coverage, DeadLetter, ReplayMark, glob_for, originals

#: KEYS: dead-letter list, target list; ARGV: (dead envelope, copy) pairs. Moves each
#: envelope still in the dead-letter list; returns how many moved.
_MOVE = """
local moved = 0
for i = 1, #ARGV, 2 do
    if redis.call("lrem", KEYS[1], 1, ARGV[i]) == 1 then
        redis.call("lpush", KEYS[2], ARGV[i + 1])
        moved = moved + 1
    end
end
return moved
"""


class _Envelope(NamedTuple):
    """One dead message as stored: its list key, raw text, and parsed form."""

    key: str
    raw: bytes
    data: dict[str, Any]


class RedisDeadLetters:
    """``DeadLetterStore`` over a Celery app's Redis dead-letter lists."""

    framework = "celery"

    def __init__(self, app: Any, queues: Sequence[str], records: JobRecords) -> None:
        import redis

        self.app = app
        self.records = records
        self.extra = list(queues)
        self._conn = app.connection_for_write()
        self.channel = self._conn.default_channel
        self.prefix: str = self.channel.global_keyprefix or ""
        self.client = redis.Redis(connection_pool=self.channel.pool)  # keys prefixed by hand
        self._move = self.client.register_script(_MOVE)
        #: The list keys a scan found per dead-letter queue (priority lists included).
        self._found: dict[str, set[str]] = {}

    def _names(self) -> dict[str, str]:
        names = dead_letter_queues(self.app, self.extra)
        templates = dead_letter_templates(self.app)
        sep = self.channel.sep  # kombu's priority lists: ``<queue><sep><priority>``
        for pattern in self._patterns(templates):
            keys = [*self.client.scan_iter(match=pattern, count=1000, _type="list"),
                    *self.client.scan_iter(match=pattern + sep + "*", count=1000, _type="list")]
            for key in keys:  # read as found: the workers' priority steps may not be ours
                name = key.decode()[len(self.prefix):]
                self._found.setdefault(name.split(sep)[0], set()).add(self.prefix + name)
            names = {**originals(sorted(self._found), templates), **names}
        return names

    def _patterns(self, templates: list[str]) -> list[str]:
        return [glob_for(self.prefix + t) for t in templates]

    def coverage(self) -> Coverage:
        patterns = ", ".join(self._patterns(dead_letter_templates(self.app)))
        return Coverage(tuple(sorted(self._names())), True,
                        f"every Redis list matching {patterns}, and the app's queues")

    def _lists(self, dead: str) -> list[str]:
        ours = [self.prefix + self.channel._q_for_pri(dead, p) for p in self.channel.priority_steps]
        return list(dict.fromkeys([*ours, *sorted(self._found.get(dead, ()))]))

    def _envelopes(self, dead: str) -> list[_Envelope]:
        found: list[_Envelope] = []
        for key in dict.fromkeys(self._lists(dead)):
            found += [_Envelope(key, raw, json.loads(raw))
                      for raw in self.client.lrange(key, 0, -1)]
        return found

    def queues(self) -> list[str]:
        templates, found = dead_letter_templates(self.app), set()
        for dead, original in self._names().items():
            found.add(original)
            if shared(dead, original, templates):  # the queues its letters name, too
                found.update(self._letter(e, original).queue for e in self._envelopes(dead))
        return sorted(found)

    def scan(self, queue: str | None = None) -> list[DeadLetter]:
        templates = dead_letter_templates(self.app)
        letters = [self._letter(e, original) for dead, original in self._names().items()
                   if queue in (None, original) or shared(dead, original, templates)
                   for e in self._envelopes(dead)]
        return [x for x in letters if queue in (None, x.queue)]  # a shared list: each its own

    def remove(self, letters: Sequence[DeadLetter]) -> list[str]:
        wanted = {x.key for x in letters}
        removed: list[str] = []
        for dead, original in self._names().items():
            for envelope in self._envelopes(dead):
                key = self._letter(envelope, original).key
                if key in wanted and self.client.lrem(envelope.key, 1, envelope.raw):
                    removed.append(key)
        return removed

    def requeue(self, moves: Sequence[tuple[DeadLetter, ReplayMark]]) -> list[str]:
        wanted = {x.key: (x, m) for x, m in moves}
        moved: list[str] = []
        for dead, original in self._names().items():
            for envelope in self._envelopes(dead):
                letter, mark = wanted.pop(self._letter(envelope, original).key, (None, None))
                if letter is None or mark is None:
                    continue
                self.records.mark(letter, mark)
                # back to the queue the letter names (its own list's, unless that is shared)
                copy = self._copy(envelope.data, letter.queue, mark)
                target = self.prefix + self.channel._q_for_pri(
                    letter.queue, self.channel._get_message_priority(copy, reverse=False))
                if self._move(keys=[envelope.key, target],
                              args=[envelope.raw, json.dumps(copy)]):
                    moved.append(letter.id)
        return moved

    def clear(self, queue: str) -> int:
        removed = 0
        templates = dead_letter_templates(self.app)
        for dead, original in self._names().items():
            if shared(dead, original, templates):  # only ``queue``'s letters go
                for envelope in self._envelopes(dead):
                    if self._letter(envelope, original).queue == queue:
                        removed += int(self.client.lrem(envelope.key, 1, envelope.raw))
            elif original == queue:
                keys = list(dict.fromkeys(self._lists(dead)))
                with self.client.pipeline(transaction=True) as pipe:
                    for key in keys:
                        pipe.llen(key)
                    pipe.delete(*keys)
                    removed += sum(pipe.execute()[:-1])
        return removed

    def close(self) -> None:
        self._conn.release()

    def _letter(self, envelope: _Envelope, original: str) -> DeadLetter:
        data = envelope.data
        properties = data.get("properties") or {}
        return dead_letter_of(body=_body(data), content_type=data.get("content-type", ""),
                              content_encoding=data.get("content-encoding", ""),
                              headers=data.get("headers") or {}, properties=properties,
                              queue=original, accept=self.app.conf.accept_content)

    def _copy(self, data: dict[str, Any], queue: str, mark: ReplayMark) -> dict[str, Any]:
        """The envelope of the replayed copy: same body, fresh headers, routed to ``queue``."""
        properties = dict(data.get("properties") or {})
        properties["delivery_info"] = {"exchange": "", "routing_key": queue}
        properties["delivery_tag"] = str(uuid.uuid4())
        properties.pop("redelivered", None)
        return {**data, "headers": replay_headers(data.get("headers") or {}, mark),
                "properties": properties}


def _body(data: dict[str, Any]) -> bytes:
    body = data.get("body", "")
    raw = body.encode() if isinstance(body, str) else bytes(body)
    encoding = (data.get("properties") or {}).get("body_encoding")
    return base64.b64decode(raw) if encoding == "base64" else raw
