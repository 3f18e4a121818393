"""What Dramatiq's ``Results`` stores for a job the policy ends: its error, as natively.

Natively a message failed for good is nacked, and ``Results.after_nack`` stores the
exception stuffed into it: ``get_result`` raises ``ResultFailure`` with that exception's
class name and text. Under ``OjsRetries`` a job may also end discarded or failed (acked:
``Results`` would store nothing, and ``get_result(block=True)`` wait out its timeout), and
a dead letter may reach ``.XQ`` on a later delivery (the hop), where the exception is gone.
So the attempt's exception is kept on the delivery (``RAISED``), its class name and text
ride on the dead-letter copy (``FAILURE_OPTION``), a dead letter is failed with a
``JobDeadLettered`` of that name and text, and a discarded or failed job's error is stored
as the job ends (``store_ended``). With no exception (a worker lost mid-job) the name is
the OJS error type.
"""

from __future__ import annotations

import logging
from typing import Any

from dramatiq.broker import Broker, MessageProxy
from dramatiq.errors import ActorNotFound
from dramatiq.results import Results

from dramatiq_ext._state import MessageState
from ojs_adapters import ErrorEntry
from ojs_adapters.failure import error_type_of
from ojs_adapters.history import bound_message

#: Attribute of a ``MessageProxy``: the exception its attempt raised.
RAISED = "_ojs_raised"
#: Option of a dead-letter copy: ``[class name, text]`` of its last attempt's exception.
FAILURE_OPTION = "ojs_failure"


class JobDeadLettered(Exception):
    """The exception a dead-lettered message carries into ``Results`` and ``StubBroker.join``
    (``celery_ext.JobDeadLettered`` is its Celery twin).

    Each is an instance of a subclass named as the last attempt's exception class, with its
    text, since ``Results`` stores ``type(exc).__name__`` and ``str(exc)``: ``get_result``
    raises ``ResultFailure("actor raised Fatal: card stolen")`` as natively. ``entry`` is
    the last error of the job's history (``None`` if it has none).
    """

    def __init__(self, text: str = "", entry: ErrorEntry | None = None) -> None:
        super().__init__(text)
        self.entry = entry


#: Registry of the subclasses made per (name, base), bounded below.
_NAMED: dict[tuple[str, type[Exception]], type[Exception]] = {}


def named(name: str, base: type[Exception]) -> type[Exception]:
    r"""A subclass of ``base`` whose ``__name__`` is ``name`` (``Results`` stores it); a name
    read from a message may hold what ``type()`` refuses (a NUL), which is dropped.

    >>> named("Fa\x00tal", Exception).__name__
    'Fatal'
    """
    name = name.replace("\x00", "") or base.__name__
    klass = _NAMED.get((name, base))
    if klass is None:
        klass = type(name, (base,), {"__qualname__": f"{base.__qualname__}[{name}]",
                                     "__module__": "dramatiq_ext"})
        if len(_NAMED) < 1024:
            _NAMED[(name, base)] = klass
    return klass


def raised_pair(message: MessageProxy) -> list[str] | None:
    """``[class name, text]`` of the exception this delivery's attempt raised, or the one
    its options carry (a dead-letter copy); ``None`` when neither is known."""
    raised = vars(message).get(RAISED)
    if isinstance(raised, BaseException):
        try:
            text = str(raised)
        except Exception:  # a broken __str__ must not break the dead letter
            text = error_type_of(type(raised))
        return [type(raised).__name__, bound_message(text)]
    carried = message.options.get(FAILURE_OPTION)
    if isinstance(carried, list) and len(carried) == 2 and carried[0] \
            and all(isinstance(part, str) for part in carried):
        return [carried[0][:256], bound_message(carried[1])]
    return None


def dead_letter_exception(message: MessageProxy, state: MessageState) -> Exception | None:
    """The ``JobDeadLettered`` a dead letter is failed with (``None``: no error known)."""
    entry = state.errors[-1] if state.errors else None
    pair = raised_pair(message) or ([entry.type, entry.message] if entry else None)
    if pair is None:
        return None
    return named(pair[0], JobDeadLettered)(pair[1], entry)


def store_ended(broker: Broker, message: MessageProxy, entry: ErrorEntry,
                logger: logging.Logger) -> None:
    """Store the error of a job ended discarded or failed, if ``Results`` keeps its result."""
    found = _results(broker, message)
    if found is None:
        return
    results, ttl = found
    raised = vars(message).get(RAISED)
    if not isinstance(raised, Exception):
        raised = named(entry.type, Exception)(entry.message)
    try:
        results.backend.store_exception(message, raised, ttl)
    except Exception:  # the job is ended and recorded: a lost result is not a lost job
        logger.warning("Could not store the result of %r.", message.message_id,
                       exc_info=True)


def _results(broker: Broker, message: MessageProxy) -> tuple[Any, int] | None:
    """The ``Results`` middleware and result TTL if it stores this message's result."""
    results = next((m for m in broker.middleware if isinstance(m, Results)), None)
    if results is None:
        return None
    try:
        actor = broker.get_actor(message.actor_name).options
    except ActorNotFound:
        return None
    options = message.options
    if not options.get("store_results", actor.get("store_results", results.store_results)):
        return None
    return results, options.get("result_ttl", actor.get("result_ttl", results.result_ttl))
