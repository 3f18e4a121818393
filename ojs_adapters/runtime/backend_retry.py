"""Broker and result-backend calls retried in place (ojs-errors.md sections 4.6 and 7, ERR-016).

A publish or a record write that fails with a broker or storage error is classified
(``BACKEND_UNAVAILABLE``, ``BACKEND_TIMEOUT``, ``BACKEND_ERROR``) by the class names along
its MRO, so nothing here imports a broker client, and tried again where it happened: 5
tries from 100 ms, each wait doubled and jittered, then ``OjsBackendError``. Any other
error is raised at once, untried.

>>> backend_error(ConnectionRefusedError("refused")).code
'BACKEND_UNAVAILABLE'
>>> backend_error(ValueError("not a backend error")) is None
True
>>> BackendRetry(jitter=False).delays()
[0.1, 0.2, 0.4, 0.8]
>>> BackendRetry(sleep=lambda s: None).call(lambda: 42, operation="demo")
42
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from ojs_adapters.classify import classify
from ojs_adapters.errors import OjsBackendError

_log = logging.getLogger("ojs_adapters.backend")

T = TypeVar("T")
#: Called before each wait: (operation, try number that failed, error, seconds to wait).
RetryHook = Callable[[str, int, OjsBackendError, float], None]

#: Class names (anywhere in the MRO) of broker/storage errors, by catalog code.
_UNAVAILABLE_NAMES = frozenset({
    "ConnectionError", "ConnectionClosed", "BrokerConnectionError", "AMQPConnectionError",
    "StreamLostError", "ConnectionWrongStateError", "ConnectionClosedByBroker",
    "ChannelWrongStateError", "RecoverableConnectionError", "OperationalError",
    "BusyLoadingError", "ChannelClosed", "ChannelClosedByBroker",
})
_TIMEOUT_NAMES = frozenset({"TimeoutError", "Timeout", "timeout", "AMQPTimeoutError"})
_ERROR_NAMES = frozenset({
    "RedisError", "ReadOnlyError", "ResponseError", "AMQPChannelError", "AMQPError",
    "NackError", "UnroutableError", "ChannelError", "RecoverableChannelError", "KombuError",
    "MessageStateError",
})

#: Registry of backend failures seen by this process, by ``"<operation>:<code>"``:
#: every failed try, and ``"<operation>:gave_up"`` when the last one failed too.
FAILURES_REGISTRY: Counter[str] = Counter()
_FAILURES_LOCK = threading.Lock()


def count_failure(operation: str, code: str) -> None:
    """Add one to ``FAILURES_REGISTRY["<operation>:<code>"]`` (thread-safe)."""
    with _FAILURES_LOCK:
        FAILURES_REGISTRY[f"{operation}:{code}"] += 1


def backend_error(exc: BaseException, *, operation: str = "") -> OjsBackendError | None:
    """``exc`` as an ``OjsBackendError`` (section 4.6), or ``None`` if it is no backend error."""
    if isinstance(exc, OjsBackendError):
        return exc
    names = {klass.__name__ for klass in type(exc).__mro__}
    code = None
    if names & _TIMEOUT_NAMES:
        code = "BACKEND_TIMEOUT"
    elif names & _UNAVAILABLE_NAMES:
        code = "BACKEND_UNAVAILABLE"
    elif names & _ERROR_NAMES:
        code = "BACKEND_ERROR"
    else:
        found = classify(exc)
        if found is not None and found.code.startswith("BACKEND_"):
            code = found.code
        elif isinstance(exc, OSError):
            code = "BACKEND_UNAVAILABLE"
    if code is None:
        return None
    details = {"operation": operation, "cause": type(exc).__name__}
    return OjsBackendError(f"{operation or 'backend call'}: {exc!r}", code=code, details=details)


@dataclass(frozen=True)
class BackendRetry:
    """How a backend call is retried in place: ``tries`` in all, waits from ``initial`` seconds.

    Parameters:
      tries: Calls in all, the first included (5).
      initial: Seconds before the second try (0.1); each next wait is ``factor`` times more.
      factor: Growth of the wait (2.0).
      max_delay: Longest single wait in seconds (2.0).
      jitter: Multiply each wait by 0.5 + u, u uniform in [0, 1) (on).
      sleep: How to wait; pass ``lambda s: None`` in tests.
      on_retry: Hook called before each wait (instrumentation).

    Example::

        retry = BackendRetry(tries=8, initial=0.05)
        retry.call(lambda: producer.publish(body), operation="publish_retry")
    """

    tries: int = 5
    initial: float = 0.1
    factor: float = 2.0
    max_delay: float = 2.0
    jitter: bool = True
    sleep: Callable[[float], None] = field(default=time.sleep, compare=False)
    on_retry: RetryHook | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.tries < 1 or self.initial < 0 or self.factor < 1 or self.max_delay < 0:
            raise ValueError("BackendRetry needs tries >= 1, initial >= 0, factor >= 1, "
                             "max_delay >= 0")

    def delays(self, sample: Callable[[], float] = random.random) -> list[float]:
        """The waits between the tries (``tries - 1`` of them), capped, jittered, capped."""
        out = []
        for n in range(self.tries - 1):
            delay = min(self.initial * self.factor ** n, self.max_delay)
            if self.jitter:
                delay = min(delay * (0.5 + sample()), self.max_delay)
            out.append(delay)
        return out

    def call(self, fn: Callable[[], T], *, operation: str) -> T:
        """``fn()``, tried again on backend errors; ``OjsBackendError`` after the last try."""
        waits: list[float] = []  # drawn at the first failure: a call that works draws none
        for number in range(1, self.tries + 1):
            try:
                return fn()
            except Exception as exc:
                error = backend_error(exc, operation=operation)
                if error is None:
                    raise
                count_failure(operation, error.code)
                if number == self.tries:
                    count_failure(operation, "gave_up")
                    error.details["tries"] = number
                    _log.warning("%s failed %d times (%s); giving up", operation, number,
                                 error.code)
                    raise error from exc
                waits = waits or self.delays()
                wait = waits[number - 1]
                _log.info("%s failed (%s: %s); try %d of %d in %.0f ms", operation, error.code,
                          type(exc).__name__, number + 1, self.tries, wait * 1000)
                if self.on_retry is not None:
                    self.on_retry(operation, number, error, wait)
                self.sleep(wait)
        raise AssertionError("unreachable")  # pragma: no cover


#: The default: 5 tries from 100 ms (ojs-errors.md section 7).
DEFAULT_BACKEND_RETRY = BackendRetry()
