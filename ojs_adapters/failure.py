"""What a failed attempt looks like to the decision engine.

Handlers raise ``JobError`` to give an OJS error type and, optionally, a
handler response code (ojs-retry.md section 7). Any other exception is
described by its class: an ``ojs_error_type`` attribute if it has one, else
``module.QualName`` with ``builtins.`` dropped. The names of its base classes
are kept too, so ``non_retryable_errors`` can name a base class (isinstance
semantics).

>>> describe_failure(JobError("payment.card_stolen", "stolen", code="DEAD_LETTER")).handler_code
'DEAD_LETTER'
>>> describe_failure(KeyError("x")).names
('KeyError', 'LookupError', 'Exception', 'BaseException')
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal, NamedTuple, cast

from ojs_adapters.catalog import HANDLER_CODES
from ojs_adapters.errors import OjsError, OjsValidationError

#: A handler response code (ojs-retry.md section 7.1).
HandlerCode = Literal["RETRY", "DISCARD", "DEAD_LETTER", "FAIL"]

# Builds a Failure without its generated __new__ (several times slower).
_new = cast(Callable[..., "Failure"], tuple.__new__)

#: Error type recorded for a worker that died mid-job (no exception reached us).
WORKER_LOST_TYPE = "ojs.worker_lost"
#: Error type recorded for a message whose OJS state cannot be read.
INVALID_PAYLOAD_TYPE = "ojs.invalid_payload"
#: Error type of a successor that cannot be published for a reason other than the broker.
UNPUBLISHABLE_TYPE = "ojs.successor_unpublishable"
#: Error type of a retry the handler asked for with no exception (``self.retry()``).
RETRY_REQUESTED_TYPE = "ojs.retry_requested"


class JobError(Exception):
    """Raise from a handler to fail with an OJS error type and an optional response code.

    ``code`` is one of ``RETRY`` (the default behaviour), ``DISCARD``,
    ``DEAD_LETTER`` or ``FAIL``; ``retry_after`` (seconds) asks for at least
    that long a delay before the next attempt.

    >>> raise JobError("payment.card_declined", "insufficient funds", code="DISCARD")
    Traceback (most recent call last):
    ...
    ojs_adapters.failure.JobError: payment.card_declined: insufficient funds
    """

    def __init__(
        self,
        type: str,
        message: str = "",
        *,
        code: HandlerCode | None = None,
        details: Mapping[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        if not isinstance(type, str) or not type.strip():
            raise OjsValidationError("JobError type must be a non-empty string",
                                     code="INVALID_ARGS", details={"field": "type"})
        if code is not None and code not in HANDLER_CODES:
            raise OjsValidationError(
                f"JobError code must be one of {sorted(HANDLER_CODES)}, got {code!r}",
                code="INVALID_ARGS", details={"field": "code", "value": repr(code)},
            )
        if retry_after is not None and (isinstance(retry_after, bool) or not retry_after >= 0):
            raise OjsValidationError(
                f"JobError retry_after must be a number of seconds >= 0, got {retry_after!r}",
                code="INVALID_ARGS", details={"field": "retry_after", "value": repr(retry_after)},
            )
        super().__init__(type, message)
        self.type = type
        self.message = message
        self.code: HandlerCode | None = code
        self.details: dict[str, Any] = dict(details or {})
        self.retry_after = retry_after

    def __str__(self) -> str:
        return f"{self.type}: {self.message}" if self.message else self.type

    def __reduce__(self) -> Any:  # picklable with its keyword arguments
        return (_rebuild_job_error,
                (self.type, self.message, self.code, self.details, self.retry_after))


def _rebuild_job_error(type_: str, message: str, code: HandlerCode | None,
                       details: dict[str, Any], retry_after: float | None) -> JobError:
    return JobError(type_, message, code=code, details=details, retry_after=retry_after)


class Failure(NamedTuple):
    """A failed attempt, reduced to what ``decide`` needs.

    ``names`` is the error type followed by the types it also answers to
    (base classes; empty: matched against no ``non_retryable_errors`` entry, as
    Dramatiq's ``Retry``); ``catalog_code`` is ``HANDLER_ERROR``, ``HANDLER_TIMEOUT``,
    ``HANDLER_PANIC`` or an ``OjsError``'s own code; ``retryable`` is the
    catalog's word for an ``OjsError`` (``None`` when the policy decides);
    ``stalled`` marks a worker crash or visibility-timeout expiry (section 9.2),
    which is retryable whatever its type while attempts remain.

    A ``NamedTuple`` rather than a frozen dataclass: it is built on every
    failure and a frozen dataclass costs several times more to construct.
    """

    type: str
    message: str
    names: tuple[str, ...]
    catalog_code: str = "HANDLER_ERROR"
    handler_code: HandlerCode | None = None
    details: Mapping[str, Any] | None = None
    retryable: bool | None = None
    stalled: bool = False
    retry_after: float | None = None

    @classmethod
    def worker_lost(cls, message: str = "worker process died while running the job",
                    *, error_type: str = WORKER_LOST_TYPE) -> Failure:
        """The failure recorded for an attempt whose worker died (RET-12, HANDLER_PANIC)."""
        return cls(error_type, message, (error_type,), catalog_code="HANDLER_PANIC",
                   stalled=True)

    @classmethod
    def invalid_payload(cls, field: str, rule: str, value: str) -> Failure:
        """The failure recorded for a message whose OJS state is unreadable (``INVALID_PAYLOAD``).

        Dead-lettered whatever the policy says (``handler_code`` ``DEAD_LETTER``, the
        adapter answering for a handler that never ran): the message is kept for a
        person to look at, since no count of its attempts can be trusted.
        ``value`` is a short repr of the offending value.

        >>> decide_input = Failure.invalid_payload("attempt", "integer >= 1", "'x'")
        >>> (decide_input.catalog_code, decide_input.handler_code, decide_input.retryable)
        ('INVALID_PAYLOAD', 'DEAD_LETTER', False)
        """
        return cls(INVALID_PAYLOAD_TYPE, f"invalid OJS state in the message: {field}: {rule}",
                   (INVALID_PAYLOAD_TYPE,), catalog_code="INVALID_PAYLOAD",
                   handler_code="DEAD_LETTER",
                   details={"field": field, "rule": rule, "value": value}, retryable=False)

    @classmethod
    def unpublishable(cls, successor: str, cause: BaseException) -> Failure:
        """The failure recorded when ``successor`` (``"retry"``) cannot be published for a
        reason other than the broker (``cause``: it cannot be encoded, a middleware refuses
        it). Trying again cannot help, so the job is dead-lettered whatever the policy says
        (``handler_code`` ``DEAD_LETTER``, as for ``invalid_payload``).

        >>> f = Failure.unpublishable("retry", TypeError("not JSON"))
        >>> f.catalog_code, f.handler_code, f.message
        ('INVALID_PAYLOAD', 'DEAD_LETTER', 'the retry could not be published: TypeError: not JSON')
        """
        kind = error_type_of(type(cause))
        try:
            text = str(cause) or kind
        except Exception:  # a broken __str__ must not break the dead letter
            text = kind
        return cls(UNPUBLISHABLE_TYPE, f"the {successor} could not be published: {kind}: {text}",
                   (UNPUBLISHABLE_TYPE,), catalog_code="INVALID_PAYLOAD",
                   handler_code="DEAD_LETTER", details={"successor": successor, "cause": kind},
                   retryable=False)


def error_type_of(exc_type: type[BaseException]) -> str:
    """The OJS error type of an exception class (DESIGN.md: ``ojs_error_type`` or its path)."""
    return _names_of(exc_type)[0]


def describe_failure(
    exc: BaseException | Failure,
    *,
    catalog_code: str | None = None,
    stalled: bool = False,
) -> Failure:
    """Turn what a handler raised into a ``Failure``.

    ``catalog_code`` lets an adapter say what kind of failure it saw
    (``HANDLER_TIMEOUT`` for a time limit, ``HANDLER_PANIC`` for a lost worker).
    """
    if isinstance(exc, Failure):
        return exc
    # Positional construction throughout: this runs on every failure.
    if isinstance(exc, JobError):
        return Failure(exc.type, exc.message, (exc.type,), catalog_code or "HANDLER_ERROR",
                       exc.code, exc.details or None, None, stalled, exc.retry_after)
    names = _names_of(exc.__class__)
    if isinstance(exc, OjsError):
        return Failure(names[0], exc.message, names, catalog_code or exc.code, None,
                       exc.details or None, exc.retryable, stalled, None)
    # tuple.__new__ directly: the common case, on every failure (see decision.py).
    return _new(Failure, (names[0], _message_of(exc), names, catalog_code or "HANDLER_ERROR",
                          None, None, None, stalled, None))


def requested_retry(cause: BaseException | None, minimum_delay: float | None) -> Failure:
    """The failure of a retry the handler asked for (Celery's ``self.retry(exc=...)``,
    Dramatiq's ``raise Retry(delay=...)``): ``cause`` described, handler code ``RETRY``
    unless it carries its own, and ``minimum_delay`` seconds as a floor on the delay.
    Both adapters use it, so the history entry is the same on both.

    >>> f = requested_retry(ValueError("stale"), 2.0)
    >>> f.type, f.handler_code, f.retry_after
    ('ValueError', 'RETRY', 2.0)

    With no ``cause`` no exception type is made up: the entry is ``ojs.retry_requested``,
    which no ``non_retryable_errors`` entry naming a class matches.

    >>> f = requested_retry(None, None)
    >>> f.type, f.message, f.names
    ('ojs.retry_requested', 'retry requested by the handler', ('ojs.retry_requested',))
    """
    if cause is None:
        return Failure(RETRY_REQUESTED_TYPE, "retry requested by the handler",
                       (RETRY_REQUESTED_TYPE,), handler_code="RETRY",
                       retry_after=None if minimum_delay is None else float(minimum_delay))
    failure = describe_failure(cause)
    retry_after = failure.retry_after
    if minimum_delay is not None:
        retry_after = max(retry_after or 0.0, float(minimum_delay))
    return failure._replace(handler_code=failure.handler_code or "RETRY",
                            retry_after=retry_after)


def _message_of(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # a broken __str__ must not break the retry path
        text = ""
    return text or type(exc).__name__


#: Registry of the names each exception class answers to, filled on first use.
_NAMES_REGISTRY: dict[type[BaseException], tuple[str, ...]] = {}


def _names_of(exc_type: type[BaseException]) -> tuple[str, ...]:
    try:
        return _NAMES_REGISTRY[exc_type]
    except KeyError:
        pass
    names = _compute_names(exc_type)
    if len(_NAMES_REGISTRY) < 4096:
        _NAMES_REGISTRY[exc_type] = names
    return names


def _compute_names(exc_type: type[BaseException]) -> tuple[str, ...]:
    own = getattr(exc_type, "ojs_error_type", None)
    names = [own] if isinstance(own, str) and own else []
    if _path_of(exc_type) not in names:
        names.append(_path_of(exc_type))
    for base in exc_type.__mro__[1:]:
        if base is object:
            continue
        declared = base.__dict__.get("ojs_error_type")
        for name in (declared, _path_of(base)):
            if isinstance(name, str) and name and name not in names:
                names.append(name)
    return tuple(names)


def _path_of(klass: type) -> str:
    module = klass.__module__
    return klass.__qualname__ if module == "builtins" else f"{module}.{klass.__qualname__}"
