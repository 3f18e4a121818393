"""The console's error pages: what went wrong, whose fault, and what to do; never a 500.

Bad input (a date, a count) is a 400 naming the field and the rule; a replay the
library refuses (``OjsError``: the workers' job records are out of reach) is a 409
that says why and how to start the console so it can; anything else raised while
reading or changing the broker is a 503 naming the broker and what to check.
"""

from __future__ import annotations

import logging

from starlette.requests import Request
from starlette.responses import Response

from ojs_adapters.errors import OjsError
from ojs_adapters.runtime.broker_errors import broker_failure, hide_password
from ojs_adapters.web._console import Console
from ojs_adapters.web._settings import ConsoleSettings

logger = logging.getLogger("ojs_adapters.web")


class BadInput(ValueError):
    """A query parameter or form field that breaks its rule; the message names both."""


def broker_named(settings: ConsoleSettings) -> str:
    """The broker as the operator gave it: ``--broker``'s URL, else the ``--app``'s."""
    if settings.broker:
        return f"the {settings.framework} broker at {hide_password(settings.broker)}"
    return f"the broker of {settings.framework} app {settings.app or '?'}"


def whole_number(value: str, field: str) -> int:
    """``value`` as a whole number from 0; ``BadInput`` naming ``field`` otherwise."""
    text = value.strip()
    if not (text.isascii() and text.isdigit()):
        raise BadInput(f"{field} must be a whole number from 0, not {value!r}")
    return int(text)


def bad_input(console: Console, request: Request, error: ValueError) -> Response:
    return console.render(request, "error.html", 400, title="Bad request", error=str(error))


def trouble(console: Console, request: Request, error: Exception, *,
            acting: bool = False) -> Response:
    """The page for ``error``, raised while reading (``acting=False``) or changing the broker."""
    if isinstance(error, OjsError):  # the library refused: nothing was done
        logger.warning("console %s refused: %s", request.url.path, error)
        advice = (" The same options work for 'ojs-retry web'; restart the console with them."
                  if acting else "")
        return console.render(request, "error.html", 409, title="Not done",
                              error=f"Nothing was changed: {error.message}.{advice}")
    logger.exception("console %s failed", request.url.path)
    broker = broker_named(console.settings)
    said = broker_failure(error, broker)  # the CLI's sentence: what failed, what to check
    if said is None:  # Python's own error types: a bug of the console's, not the broker's
        return console.render(
            request, "error.html", 500, title="Internal error",
            error=f"The console failed ({_said(error)}): this is a bug, please report it "
                  "with the log above. " + _done(acting))
    text = said[0].upper() + said[1:] + ("" if said.endswith("?") else ".")
    return console.render(request, "error.html", 503, title="Broker unavailable",
                          error=f"{text} {_done(acting)}")


def _done(acting: bool) -> str:
    """What the operator should assume was done, given the failure came while ``acting``."""
    return ("Some of the selection may have been done (each letter is either still dead or "
            "queued once): look at the dead letters again before retrying."
            if acting else "Nothing was changed.")


def _said(error: BaseException) -> str:
    """``Type: message`` of ``error``, or of what caused it when it says nothing (pika's
    ``AMQPConnectionError()``)."""
    seen: BaseException | None = error
    while seen is not None and not str(seen):
        seen = seen.__cause__ or seen.__context__
    return f"{type(error).__name__}: {seen}" if seen is not None else type(error).__name__
