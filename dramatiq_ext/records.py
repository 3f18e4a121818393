"""Reading a message's OJS job record (DESIGN.md "Job record"), wherever it is kept."""

from __future__ import annotations

from dramatiq.broker import Broker

from dramatiq_ext.middleware import OjsRetries
from ojs_adapters import JobRecord


def get_job_record(message_id: str, *, broker: Broker) -> JobRecord | None:
    """The OJS job record of a message sent through ``broker`` (``None`` if unknown).

    Readable while the job runs (``state == "active"``) and after it ends; raises
    ``RuntimeError`` when the broker has no ``OjsRetries``.

    >>> record = get_job_record(message.message_id, broker=broker)  # doctest: +SKIP
    >>> record.state, [e.code for e in record.errors]  # doctest: +SKIP
    ('completed', ['HANDLER_ERROR'])
    """
    for middleware in broker.middleware:
        if isinstance(middleware, OjsRetries):
            data = middleware.store_for(broker).load(message_id)
            return JobRecord.from_dict(data) if data else None
    raise RuntimeError("the broker has no OjsRetries middleware")
