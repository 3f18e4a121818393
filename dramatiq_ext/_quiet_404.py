"""Quiet pika's WARNING for a passive declare of a queue that does not exist.

Asking whether a ``.XQ`` exists is an expected "no" for the console and ``ojs-retry
dlq``; pika logs every 404 channel close as a WARNING, once per missing queue per look.
"""

from __future__ import annotations

import logging
import threading

#: AMQP's reply code for a queue that does not exist.
NOT_FOUND = 404


class NotFoundQuiet(logging.Filter):
    """Drops pika's WARNING on a channel closed with 404 (a passive declare of a queue that
    does not exist) logged by this thread while in the block; other codes, and other
    threads' warnings, still go through."""

    def __init__(self) -> None:
        super().__init__()
        self.thread = threading.get_ident()

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return not (record.thread == self.thread and args[:1] == (NOT_FOUND,)
                    and str(record.msg).startswith("Received remote Channel.Close"))

    def __enter__(self) -> None:
        logging.getLogger("pika.channel").addFilter(self)

    def __exit__(self, *exc: object) -> None:
        logging.getLogger("pika.channel").removeFilter(self)
