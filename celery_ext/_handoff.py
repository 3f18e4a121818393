"""Publishing an OjsTask's successor (its retry, or its dead letter) before the ack.

Celery acks an ``acks_late`` message after the task returns or raises ``Retry``, so the
successor is published first: through a connection with ``confirm_publish`` on
(``confirming_connection``: accepted, not just sent), retried in place on broker errors
(``with_retry``). Every copy carries a fresh token (header ``ojs-token``), so a retry
published twice runs once: the copy that claims its attempt first. A successor that
cannot be published for a reason other than the broker is ``Unpublishable``, and the job
is dead-lettered instead. The windows that remain: docs/lifecycle.md.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from kombu.exceptions import SerializationError, SerializerNotInstalled

from celery_ext._conf import setting
from ojs_adapters.runtime.backend_retry import DEFAULT_BACKEND_RETRY, BackendRetry
from ojs_adapters.runtime.dlq import replay_info
from ojs_adapters.runtime.handoff import attempt_id
from ojs_adapters.runtime.tokens import new_token as fresh_token

T = TypeVar("T")

#: Header holding the token of one published copy.
TOKEN_HEADER = "ojs-token"
#: App setting: a ``runtime.backend_retry.BackendRetry`` for the adapter's broker calls.
BACKEND_RETRY_SETTING = "ojs_backend_retry"
#: Confirming connections at most kept per app.
POOL_LIMIT = 16


#: Registry of confirming connection pools, one per app.
_POOLS_REGISTRY: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_POOLS_LOCK = threading.Lock()


def new_token() -> str:
    """A fresh token for one published copy (``runtime.tokens``: no system call)."""
    return fresh_token()


def backend_retry_of(app: Any) -> BackendRetry:
    """The app's ``ojs_backend_retry`` setting, else 5 tries from 100 ms."""
    value = setting(app, BACKEND_RETRY_SETTING)
    return value if isinstance(value, BackendRetry) else DEFAULT_BACKEND_RETRY


@contextmanager
def confirming_connection(app: Any) -> Iterator[Any]:
    """A pooled broker connection of ``app`` with publisher confirms on.

    A connection that failed is collected, so the next use reconnects.
    """
    with _POOLS_LOCK:
        owner, pool = _POOLS_REGISTRY.get(app, (None, None))
        if pool is None or owner != os.getpid():  # a forked pool process: kombu closed it
            connection = app.connection_for_write(transport_options={"confirm_publish": True})
            pool = connection.Pool(limit=POOL_LIMIT)
            _POOLS_REGISTRY[app] = (os.getpid(), pool)
    with pool.acquire(block=True, timeout=30) as conn:
        try:
            conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0)
            yield conn
        except Exception:
            conn.collect()
            raise


@contextmanager
def pooled_producer(app: Any) -> Iterator[Any]:
    """A producer from ``app``'s own pool, as a native retry publishes: for a broker
    without publisher confirms (``confirms``), where a confirming connection adds nothing."""
    with app.producer_or_acquire() as producer:
        yield producer


#: Registry of each app's broker transport (kombu's ``driver_type``), found once per app.
_DRIVERS_REGISTRY: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def broker_driver(app: Any) -> str:
    """``app``'s broker transport as kombu names it (``redis``, ``amqp``, ``memory``, ...)."""
    known = _DRIVERS_REGISTRY.get(app)
    if known is None:
        with app.connection_for_write() as conn:
            known = _DRIVERS_REGISTRY[app] = str(conn.transport.driver_type)
    return known


def confirms(app: Any) -> bool:
    """Whether ``app``'s broker transport has publisher confirms (AMQP). Elsewhere (Redis, the
    memory transport) an accepted publish is a written one, and a successor goes through
    the app's own producer pool, as a native retry does."""
    return broker_driver(app) == "amqp"


def with_retry(app: Any, fn: Callable[[], T], *, operation: str) -> T:
    """``fn()`` retried in place on backend errors (``OjsBackendError`` after the last try)."""
    return backend_retry_of(app).call(fn, operation=operation)


def replay_round(headers: Any) -> int:
    """How many times a dead-letter replay sent this job again (0: never): a replay
    (its ``REPLAY_HEADER``, ``celery_ext.dlq``) starts a new round of claims."""
    try:
        return int(replay_info(headers).get("replay_count", 0))
    except (TypeError, ValueError):
        return 0


def replaced_round(value: Any) -> int:
    """A message's ``replaced_task_nesting`` (Celery counts ``Task.replace`` with it; 0:
    never replaced) as a count: the replacement starts a new round of claims too.

    >>> replaced_round(2), replaced_round(None), replaced_round("junk"), replaced_round(-1)
    (2, 0, 0, 0)
    """
    return value if type(value) is int and 0 < value <= 2**31 - 1 else 0


def claim_key(job_id: str, attempt: int, *, replays: int, replaced: int) -> str:
    """What a copy claims to run: ``<task id>:<attempt>``, plus the round it runs in.

    >>> claim_key("j", 2, replays=0, replaced=0), claim_key("j", 1, replays=1, replaced=2)
    ('j:2', 'j:1/replay1/replaced2')
    """
    key = attempt_id(job_id, attempt)
    if replays:
        key += f"/replay{replays}"
    return f"{key}/replaced{replaced}" if replaced else key


#: kombu errors that no broker causes, though ``backend_retry`` reads ``KombuError`` so.
NOT_THE_BROKER = (SerializationError, SerializerNotInstalled)


class Unpublishable(Exception):
    """A successor that cannot be published for a reason other than the broker.

    Not a backend error by any of its names, so ``with_retry`` raises it at once.
    """

    def __init__(self, cause: BaseException) -> None:
        super().__init__(cause)
        self.cause = cause


def encoder_cause(error: BaseException) -> BaseException:
    """What kept a successor off the broker, kombu's serializer wrapper unwrapped, so the
    history entry is the one ``dramatiq_ext`` records for the same cause.

    >>> from kombu.exceptions import EncodeError
    >>> encoder_cause(Unpublishable(EncodeError(TypeError("not JSON"))))
    TypeError('not JSON')
    """
    cause = error.cause if isinstance(error, Unpublishable) else error
    if isinstance(cause, SerializationError) and cause.args and \
            isinstance(cause.args[0], BaseException):
        cause = cause.args[0]  # kombu's wrapper of the encoder's own error
    return cause
