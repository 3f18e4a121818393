"""Dead-letter management, one API over Celery's and Dramatiq's dead-letter queues.

List (filter by queue, task type, error type and time; paginated), show one job
with its history and original payload, replay (back to its queue as attempt 1,
history kept, ``replay_count`` and ``last_replayed_at`` recorded), delete, purge,
and retention (180 days and 10,000 per queue by default) on demand or from a
scheduler. Where a broker cannot list its queues (RabbitMQ without its
management API), ``coverage()`` says which dead-letter queues were looked in.
The broker work lives in the adapters (``dramatiq_ext.dlq``, ``celery_ext.dlq``),
found through the entry-point group ``ojs_adapters.runtime.dlq``.

>>> from datetime import datetime, timezone
>>> from ojs_adapters.runtime.dlq.memory import MemoryDeadLetterStore
>>> store = MemoryDeadLetterStore()
>>> store.add(DeadLetter(id="m1", queue="emails", task_type="send", error_type="smtp.Down",
...                      dead_lettered_at=datetime.now(timezone.utc), attempt=3))
>>> dlq = DeadLetters(store)
>>> [x.id for x in dlq.list(DeadLetterFilter(error_type="smtp.*")).items]
['m1']
>>> dlq.replay(["m1"]).replayed, store.requeued[0][1].replay_count
(('m1',), 1)
"""

from ojs_adapters.runtime.dlq._discovery import (
    MANAGEMENT_OFF,
    MANAGEMENT_TIMEOUT,
    AmqpAddress,
    Coverage,
    QueueListing,
    glob_for,
    list_queues,
    management_url,
    originals,
)
from ojs_adapters.runtime.dlq._model import (
    REPLAY_HEADER,
    ROUND_DELAYS,
    ROUND_MARKS,
    DeadLetter,
    DeadLetterFilter,
    Page,
    ReplayMark,
    closed_round,
    entry_rounds,
    last_error,
    replay_info,
    replayed_record,
    round_starts,
)
from ojs_adapters.runtime.dlq._prune_hook import prune_hook
from ojs_adapters.runtime.dlq._queue import (
    PAGE_SIZE,
    REPLAY_BATCH,
    DeadLetterQueue,
    DeadLetters,
    DeadLetterStore,
    DeleteReport,
    ReplayReport,
    Selection,
)
from ojs_adapters.runtime.dlq._registry import (
    ENTRY_POINT_GROUP,
    DeadLetterQueueGiven,
    DelayQueueGiven,
    Opener,
    OriginalQueueWanted,
    frameworks,
    load_object,
    named_module_hint,
    open_dead_letter_queue,
    read_options,
    refuse_delay_queues,
)
from ojs_adapters.runtime.dlq._retention import (
    DEFAULT_MAX_AGE,
    DEFAULT_MAX_COUNT,
    DEFAULT_RETENTION,
    Retention,
    expired,
)

__all__ = [
    "DEFAULT_MAX_AGE",
    "DEFAULT_MAX_COUNT",
    "DEFAULT_RETENTION",
    "ENTRY_POINT_GROUP",
    "MANAGEMENT_OFF",
    "MANAGEMENT_TIMEOUT",
    "PAGE_SIZE",
    "REPLAY_BATCH",
    "REPLAY_HEADER",
    "ROUND_DELAYS",
    "ROUND_MARKS",
    "AmqpAddress",
    "Coverage",
    "DeadLetter",
    "DeadLetterFilter",
    "DeadLetterQueue",
    "DeadLetterQueueGiven",
    "DeadLetterStore",
    "DeadLetters",
    "DelayQueueGiven",
    "DeleteReport",
    "Opener",
    "OriginalQueueWanted",
    "Page",
    "QueueListing",
    "ReplayMark",
    "ReplayReport",
    "Retention",
    "Selection",
    "closed_round",
    "entry_rounds",
    "expired",
    "frameworks",
    "glob_for",
    "last_error",
    "list_queues",
    "load_object",
    "management_url",
    "named_module_hint",
    "open_dead_letter_queue",
    "originals",
    "prune_hook",
    "read_options",
    "refuse_delay_queues",
    "replay_info",
    "replayed_record",
    "round_starts",
]
