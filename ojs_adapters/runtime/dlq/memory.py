"""``MemoryDeadLetterStore``: dead letters in a list, for unit tests and examples.

It follows the ``DeadLetterStore`` contract exactly (exact-message removal, one
atomic step per move) so ``DeadLetters`` can be tested without a broker;
``requeued`` holds what was sent back, with its mark.

>>> from datetime import datetime, timezone
>>> store = MemoryDeadLetterStore()
>>> store.add(DeadLetter(id="a", queue="q", task_type="t", error_type="E",
...                      dead_lettered_at=datetime.now(timezone.utc), attempt=2))
>>> [x.key for x in store.scan()]
['a']
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace

from ojs_adapters.runtime.dlq._discovery import Coverage
from ojs_adapters.runtime.dlq._model import DeadLetter, ReplayMark


class MemoryDeadLetterStore:
    """A registry of dead letters in process memory (see the module docstring)."""

    framework = "memory"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.letters: list[DeadLetter] = []
        self.requeued: list[tuple[DeadLetter, ReplayMark]] = []

    def add(self, letter: DeadLetter) -> None:
        """Dead-letter ``letter`` (its ``key`` defaults to its id)."""
        with self._lock:
            self.letters.append(letter if letter.key else replace(letter, key=letter.id))

    def queues(self) -> list[str]:
        with self._lock:
            return sorted({x.queue for x in self.letters})

    def coverage(self) -> Coverage:
        return Coverage(tuple(self.queues()), True, "process memory")

    def scan(self, queue: str | None = None) -> list[DeadLetter]:
        with self._lock:
            return [x for x in self.letters if queue is None or x.queue == queue]

    def remove(self, letters: Sequence[DeadLetter]) -> list[str]:
        keys = {x.key for x in letters}
        with self._lock:
            removed = [x.key for x in self.letters if x.key in keys]
            self.letters = [x for x in self.letters if x.key not in keys]
            return removed

    def requeue(self, moves: Sequence[tuple[DeadLetter, ReplayMark]]) -> list[str]:
        moved: list[str] = []
        for letter, mark in moves:
            with self._lock:
                if letter.key not in {x.key for x in self.letters}:
                    continue
                self.letters = [x for x in self.letters if x.key != letter.key]
                self.requeued.append((letter, mark))
            moved.append(letter.id)
        return moved

    def clear(self, queue: str) -> int:
        with self._lock:
            before = len(self.letters)
            self.letters = [x for x in self.letters if x.queue != queue]
            return before - len(self.letters)

    def close(self) -> None:
        """Nothing to release."""
