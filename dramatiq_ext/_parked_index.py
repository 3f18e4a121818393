"""The console's index of retries parked in the RabbitMQ delay levels (``_waiting``).

AMQP can count the delay levels' TTL queues but not list them, so the worker that
parks a retry there (``_handoff``) also notes it, one round trip, in the sorted set
``<record prefix>:_ojs.parked`` beside the job records, when they are in Redis
(``RedisRecordStore``, or Dramatiq's Redis ``Results``); members as in the Redis
parked set, ``[<queue>.DQ, "", message]``, scored by ``eta``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, runtime_checkable

from dramatiq.message import Message

from dramatiq_ext._parking import PARKED_KEY
from dramatiq_ext._store_results import _RESULTS_QUEUE, _RecordKey
from dramatiq_ext.stores import RedisRecordStore
from ojs_adapters.runtime import browse

logger = logging.getLogger(__name__)


@runtime_checkable
class RecordsOwner(Protocol):
    """What the index needs of the broker's ``OjsRetries``: the store it keeps records in.

    Matched by shape: ``_handoff`` notes parked retries here, and ``OjsRetries`` imports
    ``_handoff``, so this module cannot import ``OjsRetries``.
    """

    def store_for(self, broker: Any) -> Any: ...


class Index(NamedTuple):
    """The RabbitMQ parked-retry index beside a record store: its Redis client, its key,
    and the Redis key of an attempt's claim (``stores``)."""

    client: Any
    key: str
    claim_key: Callable[[str], Any]


def index_of(store: Any) -> Index | None:
    """The index beside the records of ``store`` (``None``: they are not in Redis)."""
    if isinstance(store, RedisRecordStore):
        return Index(store.client, f"{store.prefix}:{PARKED_KEY}",
                     lambda key: f"{store.prefix}:claim:{key}")
    backend: Any = getattr(store, "backend", None)
    if not hasattr(getattr(backend, "client", None), "zadd"):
        return None
    # keys as ``ResultsRecordStore`` builds them
    return Index(backend.client, f"{backend.namespace}:ojs-record:{PARKED_KEY}", lambda key:
                 backend.build_message_key(_RecordKey(_RESULTS_QUEUE, "ojs-claim", key)))


def index_parked(broker: Any, message: Message[Any]) -> None:
    """Note a ``message`` parked in the RabbitMQ delay levels in the index (one round
    trip); a failure is logged, never raised: the retry is parked already."""
    try:
        ojs = next((m for m in broker.middleware if isinstance(m, RecordsOwner)), None)
        if ojs is not None and (index := index_of(ojs.store_for(broker))) is not None:
            member = json.dumps([message.queue_name, "", message.encode().decode()])
            browse.add_to_index(index.client, index.key, member,
                                float(message.options["eta"]) / 1000)
    except Exception:
        logger.warning("Could not note a parked retry in the console's index.", exc_info=True)
