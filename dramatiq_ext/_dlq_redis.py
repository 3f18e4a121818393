"""Dead letters of a ``RedisBroker``: the ``<ns>:<queue>.XQ`` sorted sets and their hashes.

Dramatiq's layout (``dramatiq/brokers/redis/dispatch.lua``): ``<ns>:<q>.XQ`` maps
each dead message's Redis id to when it was dead-lettered (ms), ``<ns>:<q>.XQ.msgs``
the id to the encoded message; a live queue is the list ``<ns>:<q>`` of ids plus
the hash ``<ns>:<q>.msgs``. A dead message's key is its Redis id.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from dramatiq_ext._dlq_common import (
    JobRecords,
    dead_letter_of,
    decoded,
    replay_message,
    undecodable_letter,
)
from ojs_adapters.runtime.dlq import Coverage, DeadLetter, ReplayMark, glob_for

#: Moves dead messages back to their queue, each only if it is still dead (so a
#: second replay of the same message does nothing). KEYS: xq, xq.msgs, queue,
#: queue.msgs; ARGV: (dead id, new id, new data) triples. Returns the moved dead ids.
_MOVE = """
local moved = {}
for i = 1, #ARGV, 3 do
    if redis.call("zrem", KEYS[1], ARGV[i]) == 1 then
        redis.call("hdel", KEYS[2], ARGV[i])
        redis.call("hset", KEYS[4], ARGV[i + 1], ARGV[i + 2])
        redis.call("rpush", KEYS[3], ARGV[i + 1])
        table.insert(moved, ARGV[i])
    end
end
return moved
"""


class RedisDeadLetters:
    """``DeadLetterStore`` over a ``RedisBroker``'s dead-letter sorted sets."""

    framework = "dramatiq"

    def __init__(self, broker: Any, records: JobRecords, queues: Sequence[str]) -> None:
        self.broker = broker
        self.client = broker.client
        self.namespace: str = broker.namespace
        self.records = records
        self.extra = list(queues)
        self._move = self.client.register_script(_MOVE)

    def _key(self, queue: str, suffix: str = "") -> str:
        return f"{self.namespace}:{queue}{suffix}"

    def queues(self) -> list[str]:
        prefix, found = f"{self.namespace}:", set(self.extra)
        for raw in self.client.scan_iter(match=self._pattern(), count=1000, _type="zset"):
            found.add(_text(raw)[len(prefix):-len(".XQ")])
        declared = {q for q in self.broker.get_declared_queues() if not q.endswith((".DQ", ".XQ"))}
        return sorted(found | declared)

    def coverage(self) -> Coverage:
        looked = tuple(f"{q}.XQ" for q in self.queues())
        return Coverage(looked, True, f"every Redis key matching {self._pattern()!r}")

    def _pattern(self) -> str:
        return glob_for(f"{self.namespace}:{{queue}}.XQ")

    def scan(self, queue: str | None = None) -> list[DeadLetter]:
        letters: list[DeadLetter] = []
        for name in [queue] if queue else self.queues():
            pairs = self.client.zrange(self._key(name, ".XQ"), 0, -1, withscores=True)
            if not pairs:
                continue
            datas = self.client.hmget(self._key(name, ".XQ.msgs"), [k for k, _ in pairs])
            for (raw_id, score), data in zip(pairs, datas, strict=True):
                if data is not None:  # removed between the two reads
                    at = datetime.fromtimestamp(score / 1000, timezone.utc)
                    message, key = decoded(data), _text(raw_id)
                    letters.append(undecodable_letter(data, queue=name, key=key, at=at)
                                   if message is None else dead_letter_of(message, key=key, at=at))
        return letters

    def remove(self, letters: Sequence[DeadLetter]) -> list[str]:
        removed: list[str] = []
        for name, group in _by_queue(letters).items():
            keys = list(dict.fromkeys(x.key for x in group))
            with self.client.pipeline(transaction=True) as pipe:
                for key in keys:  # one ZREM each: its reply says whether that one was there
                    pipe.zrem(self._key(name, ".XQ"), key)
                pipe.hdel(self._key(name, ".XQ.msgs"), *keys)
                replies = pipe.execute()[:-1]  # the ZREMs'; the HDEL's last
            removed += [key for key, gone in zip(keys, replies, strict=True) if gone]
        return removed

    def requeue(self, moves: Sequence[tuple[DeadLetter, ReplayMark]]) -> list[str]:
        moved: set[str] = set()
        for name, group in _by_queue([x for x, _ in moves]).items():
            marks = {x.key: m for x, m in moves if x.queue == name}
            args: list[str | bytes] = []
            datas = self.client.hmget(self._key(name, ".XQ.msgs"), [x.key for x in group])
            for letter, data in zip(group, datas, strict=True):
                message = None if data is None else decoded(data)
                if message is None:  # gone (replayed or removed meanwhile), or no job in it
                    continue
                mark = marks[letter.key]
                self.records.mark(letter, mark)
                redis_id = str(uuid.uuid4())
                copy = replay_message(message, mark)
                copy = copy.copy(options={"redis_message_id": redis_id})
                args += [letter.key, redis_id, copy.encode()]
            if args:
                keys = [self._key(name, s) for s in (".XQ", ".XQ.msgs", "", ".msgs")]
                moved.update(_text(k) for k in self._move(keys=keys, args=args))
        return [x.id for x, _ in moves if x.key in moved]

    def clear(self, queue: str) -> int:
        with self.client.pipeline(transaction=True) as pipe:
            pipe.zcard(self._key(queue, ".XQ"))
            pipe.delete(self._key(queue, ".XQ"), self._key(queue, ".XQ.msgs"))
            return int(pipe.execute()[0])

    def close(self) -> None:
        """Nothing to release: the broker's client belongs to the broker."""


def _by_queue(letters: Sequence[DeadLetter]) -> dict[str, list[DeadLetter]]:
    groups: dict[str, list[DeadLetter]] = {}
    for letter in letters:
        groups.setdefault(letter.queue, []).append(letter)
    return groups


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
