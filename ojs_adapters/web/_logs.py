"""How ``ojs-retry web`` logs when nothing else set logging up: the project's lines, not
the broker clients' chatter.

The console's own loggers (the audit log on ``ojs_adapters.web.audit``, the adapters'
notes) log at INFO; everything else, the broker clients pika, kombu and amqp among them,
at WARNING: pika alone logs a dozen INFO lines per connection. Logging someone already
configured (a handler on the root logger) is left as it is.
"""

from __future__ import annotations

import logging

#: The project's loggers, shown at INFO.
OWN_LOGGERS = ("ojs_adapters", "celery_ext", "dramatiq_ext")
#: How each line looks.
FORMAT = "%(asctime)s %(name)s %(message)s"


def console_logging() -> bool:
    """Log the project's INFO lines and others' warnings to stderr, unless logging is
    already configured; whether it configured anything.

    A level a logger of the project already has is kept.
    """
    root = logging.getLogger()
    if root.handlers:
        return False
    logging.basicConfig(level=logging.WARNING, format=FORMAT)
    for name in OWN_LOGGERS:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.INFO)
    return True
