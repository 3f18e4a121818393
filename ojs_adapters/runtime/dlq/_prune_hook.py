"""``prune_hook``: dead-letter retention (``_retention``) run from a scheduler.

Cron, Celery beat or APScheduler calls the hook; it opens the dead-letter queue,
prunes it and closes it again, so nothing stays connected between runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ojs_adapters.runtime.dlq._queue import DeadLetterQueue
from ojs_adapters.runtime.dlq._retention import DEFAULT_RETENTION, Retention

_log = logging.getLogger(__name__)


def prune_hook(open_queue: Callable[[], DeadLetterQueue],
               retention: Retention = DEFAULT_RETENTION) -> Callable[[], int]:
    """A zero-argument function for a scheduler (cron, Celery beat, APScheduler) that prunes.

    Each call opens the queue with ``open_queue``, prunes it by ``retention``,
    closes it and returns how many dead letters it removed. Errors are logged and
    re-raised so the scheduler sees them.

    >>> hook = prune_hook(lambda: open_dead_letter_queue("dramatiq", broker=URL))  # doctest: +SKIP
    >>> scheduler.add_job(hook, "interval", hours=1)  # doctest: +SKIP
    """

    def prune_dead_letters() -> int:
        queue = open_queue()
        try:
            removed = queue.prune(retention)
        except Exception:
            _log.exception("Pruning dead letters failed.")
            raise
        finally:
            queue.close()
        _log.info("Pruned %d dead letters (max_age=%s, max_count=%s).", removed,
                  retention.max_age, retention.max_count)
        return removed

    return prune_dead_letters
