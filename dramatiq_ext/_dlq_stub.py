"""Dead letters of a ``StubBroker``: its ``dead_letters_by_queue`` lists, in process."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from dramatiq.common import q_name

from dramatiq_ext._dlq_common import JobRecords, dead_letter_of, replay_message
from ojs_adapters.runtime.dlq import Coverage, DeadLetter, ReplayMark

#: One lock for every StubBroker: a registry of nothing but mutual exclusion.
_LOCK = threading.Lock()


class StubDeadLetters:
    """``DeadLetterStore`` over a ``StubBroker``; a dead message's key is its proxy's id()."""

    framework = "dramatiq"

    def __init__(self, broker: Any, records: JobRecords, queues: Sequence[str]) -> None:
        self.broker = broker
        self.records = records
        self.extra = list(queues)

    def queues(self) -> list[str]:
        dead = [q_name(name) for name, items in self.broker.dead_letters_by_queue.items() if items]
        return sorted({*dead, *self.extra})

    def coverage(self) -> Coverage:
        return Coverage(tuple(f"{q}.XQ" for q in self.queues()), True, "the StubBroker's memory")

    def scan(self, queue: str | None = None) -> list[DeadLetter]:
        with _LOCK:
            return [dead_letter_of(proxy._message, key=str(id(proxy)))
                    for name, items in self.broker.dead_letters_by_queue.items()
                    if queue in (None, q_name(name)) for proxy in items]

    def remove(self, letters: Sequence[DeadLetter]) -> list[str]:
        keys = {x.key for x in letters}
        removed: list[str] = []
        with _LOCK:
            for items in self.broker.dead_letters_by_queue.values():
                removed += [str(id(p)) for p in items if str(id(p)) in keys]
                # in place: the stub's consumers hold these lists
                items[:] = [p for p in items if str(id(p)) not in keys]
        return removed

    def requeue(self, moves: Sequence[tuple[DeadLetter, ReplayMark]]) -> list[str]:
        moved: list[str] = []
        for letter, mark in moves:
            with _LOCK:
                found = [(items, p) for items in self.broker.dead_letters_by_queue.values()
                         for p in items if str(id(p)) == letter.key]
                if not found:
                    continue
                items, proxy = found[0]
                self.records.mark(letter, mark)
                self.broker.enqueue(replay_message(proxy._message, mark))
                items.remove(proxy)
            moved.append(letter.id)
        return moved

    def clear(self, queue: str) -> int:
        with _LOCK:
            count = 0
            for name, items in self.broker.dead_letters_by_queue.items():
                if q_name(name) == queue:
                    count += len(items)
                    items.clear()
        return count

    def close(self) -> None:
        """Nothing to release: the broker belongs to the caller."""
