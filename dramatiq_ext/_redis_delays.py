"""Retries a Dramatiq worker held on Redis come back after its link to Redis broke.

A Dramatiq worker keeps the delayed messages it fetched from ``<queue>.DQ`` (our
retries, waiting for their ``eta``) in an in-memory delay queue; their ids sit in
the worker's ack set ``<namespace>:__acks__.<broker id>.<queue>.DQ`` until the
worker forwards them to ``<queue>``. When the consumer hits a connection error (a
Redis restart), Dramatiq drops that delay queue and starts a new consumer: the ids
stay in the ack set, which Dramatiq's maintenance only requeues once the worker is
dead (``heartbeat_timeout``). A live worker would never run those retries.

``recover_delays(broker)`` wraps the ``consume`` of a ``RedisBroker``: before a new
consumer of a ``.DQ`` queue starts, every id left in this broker's ack set of that
queue goes back to the queue (Dramatiq's own ``requeue`` command), to be fetched
again and held until its ``eta`` as before (RET-11). At that moment the consumer
thread of that queue holds none of its messages (its delay queue was either
requeued by ``close()`` or dropped), so nothing held is handed out twice. Two
``Worker`` objects sharing one broker object share its ack sets: one's restart would
then also requeue retries the other still holds, and the attempt claim
(``stores.claim``) drops the second copy.
"""

from __future__ import annotations

import logging
from typing import Any

from dramatiq.broker import Broker, Consumer
from dramatiq.errors import ConnectionClosed

logger = logging.getLogger(__name__)

#: Attribute marking a broker whose ``consume`` is already wrapped.
_WRAPPED = "_ojs_recovers_delays"
#: Ids per ``requeue`` call.
_BATCH = 500


def recover_delays(broker: Broker) -> bool:
    """Wrap ``broker.consume`` (a ``RedisBroker``'s, once) as the module docstring says.

    Returns whether ``broker`` is a Redis broker (wrapped now or before).
    """
    try:
        from dramatiq.brokers.redis import RedisBroker
    except ImportError:  # dramatiq without its redis extra
        return False
    if not isinstance(broker, RedisBroker):
        return False
    if getattr(broker, _WRAPPED, False):
        return True
    consume = broker.consume

    def consume_after_recovery(queue_name: str, prefetch: int = 1,
                               timeout: int = 5000) -> Consumer:
        if queue_name.endswith(".DQ"):
            requeue_stranded(broker, queue_name)
        return consume(queue_name, prefetch=prefetch, timeout=timeout)

    broker.consume = consume_after_recovery  # type: ignore[method-assign]
    setattr(broker, _WRAPPED, True)
    return True


def requeue_stranded(broker: Any, queue_name: str) -> int:
    """Put back on ``queue_name`` every id in this broker's ack set of it; how many.

    A Redis error becomes Dramatiq's ``ConnectionClosed``, so the consumer thread
    waits and calls ``consume`` (and this) again.
    """
    import redis

    acks = f"{broker.namespace}:__acks__.{broker.broker_id}.{queue_name}"
    try:
        stranded = [i.decode() if isinstance(i, bytes) else str(i)
                    for i in broker.client.smembers(acks)]
        for start in range(0, len(stranded), _BATCH):
            broker.do_requeue(queue_name, *stranded[start:start + _BATCH])
    except redis.ConnectionError as error:
        raise ConnectionClosed(error) from None  # type: ignore[no-untyped-call]
    if stranded:
        logger.warning("Requeued %d delayed messages of %r that this worker held when its "
                       "Redis link broke.", len(stranded), queue_name)
    return len(stranded)
