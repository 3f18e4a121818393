"""Dramatiq's ``Callbacks``, kept from taking a delivery stopped unrun for a failed attempt.

A delivery that must not run (a copy of an attempt already handled, a delivery given back
to the broker) ends with ``AttemptConsumed``, an exception, and ``Callbacks`` sends the
actor's ``on_failure`` for any exception. Natively that copy would simply run, so no
``on_failure`` goes out for it here either; one still does for ``AttemptConsumed`` that
stands for a failed attempt (``failed=True``: lost with its worker, unreadable state).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from dramatiq.broker import Broker, MessageProxy
from dramatiq.middleware import Callbacks, Middleware

from dramatiq_ext._outcome import AttemptConsumed

#: Instance attribute marking a ``Callbacks`` already told apart (wrapped once only).
_WRAPPED = "_ojs_unrun_is_no_failure"


def quiet_unrun(middleware: Middleware) -> None:
    """Wrap ``middleware``'s ``after_process_message`` if it is a ``Callbacks`` (subclasses
    too) so that a delivery ``AttemptConsumed`` stopped unrun sends no ``on_failure``."""
    if not isinstance(middleware, Callbacks) or vars(middleware).get(_WRAPPED):
        return
    vars(middleware)["after_process_message"] = functools.partial(_after, middleware)
    vars(middleware)[_WRAPPED] = True


def _after(middleware: Middleware, broker: Broker, message: MessageProxy, *,
           result: Any = None, exception: BaseException | None = None) -> None:
    """The class's hook, looked up at each call (a patched class still counts), unless
    ``exception`` stopped the delivery unrun."""
    if isinstance(exception, AttemptConsumed) and not exception.failed:
        return
    hook: Callable[..., None] = type(middleware).after_process_message
    hook(middleware, broker, message, result=result, exception=exception)
