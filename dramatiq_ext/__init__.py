"""The Open Job Spec retry policy for Dramatiq: one middleware, ``OjsRetries``.

Add it to the broker (it takes the place of Dramatiq's ``Retries``), give actors or
messages a ``retry_policy``, and read each message's job record by id:

>>> import dramatiq
>>> from dramatiq.brokers.stub import StubBroker
>>> broker = StubBroker()
>>> broker.add_middleware(OjsRetries(default_policy={"max_attempts": 5}))
>>> @dramatiq.actor(broker=broker, retry_policy={"on_exhaustion": "dead_letter"})
... def charge(order_id):
...     pass
>>> message = charge.send_with_options(args=(7,), retry_policy={"max_attempts": 2})
>>> get_job_record(message.message_id, broker=broker) is None  # not started yet
True
"""

from dramatiq_ext._context import current_job
from dramatiq_ext._options import BUDGET_OPTION, KEY_OPTION, POLICY_OPTION, InvalidRetryPolicy
from dramatiq_ext._state import STATE_OPTION
from dramatiq_ext.middleware import (
    ACTOR_OPTIONS,
    DeadLettered,
    JitterSource,
    JobDeadLettered,
    OjsRetries,
)
from dramatiq_ext.records import get_job_record
from dramatiq_ext.stores import (
    MemoryRecordStore,
    RecordStore,
    RedisRecordStore,
    ResultsRecordStore,
)

__all__ = [
    "ACTOR_OPTIONS",
    "BUDGET_OPTION",
    "KEY_OPTION",
    "POLICY_OPTION",
    "STATE_OPTION",
    "DeadLettered",
    "InvalidRetryPolicy",
    "JitterSource",
    "JobDeadLettered",
    "MemoryRecordStore",
    "OjsRetries",
    "RecordStore",
    "RedisRecordStore",
    "ResultsRecordStore",
    "current_job",
    "get_job_record",
]
