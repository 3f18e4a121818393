"""Browsing a Redis set of parked retries for the console, the same for both adapters.

Both adapters park a long retry in a sorted set scored by its due time (their
``_parking`` modules); the console finds members by job id (``ZSCAN MATCH``, the id
is in the member's text) or scans the set in rank order, a chunk per round trip,
keeping what holds every needle. The adapters say how a member reads (``_parked``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from ojs_adapters.browse import WaitingRetry

#: Members read per round trip while filtering the parked set.
CHUNK = 1000


def glob_escape(text: str) -> str:
    """``text`` as a literal inside a Redis ``MATCH`` pattern.

    >>> glob_escape("a*b[c]")
    'a\\\\*b\\\\[c\\\\]'
    """
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)


class ParkedSetScan:
    """Mixin: ``_members`` and ``_scan`` over ``parked_key`` with the client ``redis``."""

    redis: Any

    @property
    def parked_key(self) -> str:
        """The sorted set of parked retries."""
        raise NotImplementedError

    def _parked(self, member: bytes, score: float) -> WaitingRetry:
        """How one member of the set reads (the adapter's envelope)."""
        raise NotImplementedError

    def _members(self, ids: Sequence[str]) -> Iterator[tuple[bytes, float]]:
        """The parked members of jobs ``ids`` (found by the server: ``ZSCAN MATCH``)."""
        assert self.redis is not None
        for job_id in dict.fromkeys(ids):
            pattern = f"*{glob_escape(job_id)}*"
            for member, score in self.redis.zscan_iter(self.parked_key, match=pattern,
                                                       count=1000):
                if self._parked(member, score).id == job_id:
                    yield member, score

    def _scan(self, needles: list[bytes]) -> Iterator[tuple[bytes, float]]:
        """Every parked member containing all ``needles``, soonest first, a chunk at a time."""
        assert self.redis is not None
        start = 0
        while True:
            pairs = self.redis.zrange(self.parked_key, start, start + CHUNK - 1, withscores=True)
            for member, score in pairs:
                if all(n in member for n in needles):
                    yield member, score
            if len(pairs) < CHUNK:
                return
            start += CHUNK
