"""Attempt leases on Dramatiq (``ojs_adapters.leases``): how a second delivery waits.

Dramatiq hands a message out again while its first delivery is still at work when
RabbitMQ gives back the unacked messages of a dropped connection (the worker goes on
with it, and holds its ack while a successor or a record cannot be written), when a
delay-queue message whose ack was lost is forwarded twice, and when Redis queue
maintenance re-pushes the unacked messages of a worker it takes for dead. Each
delivery therefore takes the attempt's lease before it claims and reads the record
(``middleware._lease_attempt``): a copy that judged first and leased after could find
the record not yet ``active`` and count the attempt lost while its twin had just
claimed it. The wait for another delivery's lease is no part of the actor's run:
``time_limit_paused`` stops Dramatiq's ``TimeLimit`` meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from dramatiq.broker import Broker, MessageProxy
from dramatiq.middleware import TimeLimit

from ojs_adapters.leases import Heartbeat

#: Renews the leases of the Dramatiq deliveries this process works on (a registry).
HEARTBEAT = Heartbeat()


@contextmanager
def time_limit_paused(broker: Broker, message: MessageProxy) -> Iterator[None]:
    """Dramatiq's ``TimeLimit`` stopped for this thread while the adapter waits, then
    started afresh: a wait for another delivery is no part of the actor's run (its time
    limit would otherwise end the attempt as ``HANDLER_TIMEOUT`` before it began)."""
    limits = [m for m in broker.middleware if isinstance(m, TimeLimit)]
    for limit in limits:
        limit.after_process_message(broker, message)  # type: ignore[no-untyped-call]
    try:
        yield
    finally:
        for limit in limits:
            limit.before_process_message(broker, message)  # type: ignore[no-untyped-call]

