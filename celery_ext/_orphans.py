"""Deliveries a Celery worker held when its Redis link broke go back to their queue.

When the worker's connection to Redis breaks (a Redis restart), Celery forgets what
its consumer held (retries waiting for their ETA, prefetched messages) and kombu
closes the channel, which puts every unacked delivery back on its queue, if Redis
answers at that moment. During a restart it does not: the deliveries stay in kombu's
``unacked`` hash, and only the ``visibility_timeout`` sweep (an hour by default)
would ever hand them out again, long after their countdown.

The visibility heartbeat (``_heartbeat``) knows which deliveries its process held.
When their channel closes unacked, it hands them to ``hand_back``, which puts each
one back on its queue with kombu's own ``QoS.restore_by_tag`` (what kombu's close
would have done) over a fresh connection of the same settings, as soon as Redis
answers; the waiting retry is then delivered again and held until its ETA (RET-11).

Skipped: a delivery no longer in the ``unacked_index`` (kombu's close restored it, or
it was acked), and one whose score there is newer than the heartbeat last set it
(it was delivered again since, and someone holds it). What slips through those checks
(a race, hosts whose clocks disagree) is a second copy of an attempt, which the
attempt claim drops (``_attempt``). A Redis that restarts without persistence has
lost the deliveries (and the queues) anyway.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

logger = logging.getLogger("celery_ext")


class Orphan(Protocol):
    """What ``hand_back`` needs of a held delivery (``_heartbeat._Held``)."""

    message: Any
    owner: Any  # the kombu ``Connection`` the delivery came over
    stamp: float  # the last score the heartbeat set (or when it began to hold it)


_O = TypeVar("_O", bound=Orphan)


def hand_back(orphans: Sequence[_O]) -> list[_O]:
    """Put ``orphans`` back on their queues; return those Redis did not answer for yet."""
    groups: dict[int, list[_O]] = {}
    for orphan in orphans:
        if orphan.owner is not None:
            groups.setdefault(id(orphan.owner), []).append(orphan)
    left: list[_O] = []
    for group in groups.values():
        try:
            restored = _restore(group)
        except Exception as error:  # Redis still down: the next heartbeat tick tries again
            logger.debug("ojs-adapters: cannot hand %d deliveries back yet: %r",
                         len(group), error)
            left.extend(group)
            continue
        if restored:
            logger.warning("ojs-adapters: %d deliveries held when the Redis connection broke "
                           "are back on their queue", restored)
    return left


def _restore(group: Sequence[Orphan]) -> int:
    with group[0].owner.clone() as connection:
        channel = connection.channel()  # one connect try (``default_channel`` retries for ever)
        try:
            index = channel.unacked_index_key
            with channel.conn_or_acquire() as client:
                restored = 0
                for orphan in group:
                    tag = orphan.message.delivery_tag
                    score = client.zscore(index, tag)
                    if score is None or float(score) > orphan.stamp:
                        continue
                    channel.qos.restore_by_tag(tag, client)
                    restored += 1
                return restored
        finally:
            channel.close()
