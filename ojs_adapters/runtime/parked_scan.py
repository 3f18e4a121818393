"""Browsing a Redis set of parked retries for the console, the same for both adapters.

Both adapters park a long retry in a sorted set scored by its due time (their
``_parking`` modules); the console finds members by job id (``ZSCAN MATCH``, the id
is in the member's text) or scans the set in rank order, a chunk per round trip,
keeping what holds every needle; ``_page`` pages it. The adapters say how a member
reads (``_parked``, and lightly ``_matches``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from ojs_adapters.runtime.browse import (
    INDEX_GRACE,
    WaitingFilter,
    WaitingPage,
    WaitingRetry,
    WaitingSource,
)

#: Members read per round trip while filtering the parked set.
CHUNK = 1000


def glob_escape(text: str) -> str:
    """``text`` as a literal inside a Redis ``MATCH`` pattern.

    >>> glob_escape("a*b[c]")
    'a\\\\*b\\\\[c\\\\]'
    """
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)


def memory_page(retries: Iterable[WaitingRetry], filters: WaitingFilter, *, page: int,
                per_page: int) -> WaitingPage:
    """Page ``page`` of ``retries`` (a worker's own, in memory) that pass ``filters``,
    soonest first."""
    start = (page - 1) * per_page
    found = sorted((x for x in retries if filters.matches(x)),
                   key=lambda x: x.due_at or datetime.min.replace(tzinfo=timezone.utc))
    return WaitingPage(tuple(found[start:start + per_page]), page, per_page, len(found))


class ParkedSetScan:
    """Mixin: ``_page``, ``_members``, ``_act`` and ``_scan`` over ``parked_key`` with the
    client ``redis``; on RabbitMQ (``amqp``) the set is the index workers keep."""

    redis: Any
    amqp: bool

    def _indexed(self, parked: WaitingSource, where: str, kept_by: str) -> WaitingSource:
        """``parked`` (RabbitMQ's delay levels, in ``where``) listed and actionable from the
        index the workers keep ``kept_by``, if there is a Redis for it."""
        if self.redis is None:
            return parked
        return replace(parked, listable=True, actionable=True, count=int(
            self.redis.zcount(self.parked_key, time.time() - INDEX_GRACE, "+inf")),
            note=f"Listed from the index the workers keep {kept_by}; {where} keep an "
            "original whose retry ran early or was discarded until due, then drop it.")

    def _parked_page(self, filters: WaitingFilter, needles: list[bytes], *, page: int,
                     per_page: int) -> WaitingPage:
        """``_page`` of the parked set; the index keeps entries a while after they came due
        (and ran), which are not listed."""
        low = time.time() - INDEX_GRACE if self.amqp else float("-inf")
        return self._page(filters, needles, low=low, page=page, per_page=per_page)

    @property
    def parked_key(self) -> str:
        """The sorted set of parked retries."""
        raise NotImplementedError

    def _parked(self, member: bytes, score: float) -> WaitingRetry:
        """How one member of the set reads (the adapter's envelope)."""
        raise NotImplementedError

    def _matches(self, member: bytes, filters: WaitingFilter) -> bool:
        """Whether one member passes ``filters`` (read lightly: the page is decoded whole)."""
        raise NotImplementedError

    def _page(self, filters: WaitingFilter, needles: list[bytes], *, low: float, page: int,
              per_page: int) -> WaitingPage:
        """Page ``page`` of the members due from ``low`` on that pass ``filters``: ranges
        on the server without a filter, else ``_scan`` with only the page decoded."""
        start = (page - 1) * per_page
        if filters == WaitingFilter():
            with self.redis.pipeline(transaction=False) as pipe:
                pipe.zcount(self.parked_key, low, "+inf")
                pipe.zrangebyscore(self.parked_key, low, "+inf", start=start, num=per_page,
                                   withscores=True)
                total, pairs = pipe.execute()
            return WaitingPage(tuple(self._parked(m, s) for m, s in pairs), page, per_page,
                               int(total))
        total, kept = 0, []
        for member in self._scan(needles, low):
            if self._matches(member, filters):
                if start <= total < start + per_page:
                    kept.append(member)
                total += 1
        with self.redis.pipeline(transaction=False) as pipe:  # the page's scores only
            for member in kept:
                pipe.zscore(self.parked_key, member)
            scores = pipe.execute() if kept else []
        return WaitingPage(tuple(self._parked(m, float(s)) for m, s in zip(
            kept, scores, strict=True) if s is not None), page, per_page, total)

    def _act(self, ids: Sequence[str], step: Callable[[bytes, float], bool]) -> list[bytes]:
        """Take each parked member of jobs ``ids`` off the set (of two callers, one gets
        it) and run ``step`` on it; a member whose ``step`` raises goes back. The members
        whose ``step`` said it was done."""
        done = []
        for member, score in self._members(ids):
            if not self.redis.zrem(self.parked_key, member):
                continue
            try:
                if step(member, score):
                    done.append(member)
            except Exception:
                self.redis.zadd(self.parked_key, {member: score})
                raise
        return done

    def _members(self, ids: Sequence[str]) -> Iterator[tuple[bytes, float]]:
        """The parked members of jobs ``ids`` (found by the server: ``ZSCAN MATCH``)."""
        assert self.redis is not None
        for job_id in dict.fromkeys(ids):
            pattern = f"*{glob_escape(job_id)}*"
            for member, score in self.redis.zscan_iter(self.parked_key, match=pattern,
                                                       count=1000):
                if self._parked(member, score).id == job_id:
                    yield member, score

    def _scan(self, needles: list[bytes], low: float = float("-inf")) -> Iterator[bytes]:
        """Every member due from ``low`` on that contains all ``needles``, soonest first, a
        chunk at a time (no scores: each would cost a parse per member)."""
        assert self.redis is not None
        start = 0
        while True:
            members = self.redis.zrangebyscore(self.parked_key, low, "+inf", start=start,
                                               num=CHUNK)
            for member in members:
                if all(n in member for n in needles):
                    yield member
            if len(members) < CHUNK:
                return
            start += CHUNK
