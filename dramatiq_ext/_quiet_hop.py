"""A dead letter's hop into ``.XQ`` logs no "Message ... was skipped." WARNING.

Off a ``RedisBroker`` a dead letter is a copy that the worker taking it fails unrun:
``OjsRetries.before_process_message`` raises ``SkipMessage``, and Dramatiq's worker logs
a WARNING for every skip. For this hop it is noise: the job's end was logged where it was
decided (``ojs_adapters.retry``), and ``OjsRetries`` logs the dead letter at INFO as it
reaches ``.XQ``. A filter on the worker's logger drops the line for deliveries marked
here; a skip of any other message (the actor's, ``AgeLimit``'s) still warns.
"""

from __future__ import annotations

import logging

from dramatiq.broker import MessageProxy

#: Attribute of a ``MessageProxy`` that is the hop of a dead letter into ``.XQ``.
HOP = "_ojs_dead_letter_hop"
#: The logger of Dramatiq's worker threads (``dramatiq.logging.get_logger``).
WORKER_LOGGER = "dramatiq.worker.WorkerThread"
#: Dramatiq's line, as its worker logs it (``worker.py``).
SKIPPED = "Message %s was skipped."


class QuietHop(logging.Filter):
    """Drops Dramatiq's "was skipped" record of a delivery marked ``HOP``."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != SKIPPED or not isinstance(record.args, tuple) or not record.args:
            return True
        return not getattr(record.args[0], "__dict__", {}).get(HOP)


def quiet_hop(message: MessageProxy) -> None:
    """Mark ``message`` as a dead letter's hop, and filter the worker's logger (once)."""
    vars(message)[HOP] = True
    logger = logging.getLogger(WORKER_LOGGER)
    if not any(isinstance(f, QuietHop) for f in logger.filters):
        logger.addFilter(QuietHop())
