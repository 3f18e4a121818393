"""A retry sent the native way (``Task.retry``): through a connection that confirms it on
AMQP, through the app's producer pool elsewhere (as a native retry; nothing to confirm).

Each try gets a fresh ``ojs-token`` header, so two tries that both land are told apart
by their claims; a long countdown is parked on the broker (``_parking``, RET-11).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from celery import Task
from celery.exceptions import Reject, Retry

from celery_ext._handoff import (
    NOT_THE_BROKER,
    TOKEN_HEADER,
    Unpublishable,
    confirming_connection,
    confirms,
    encoder_cause,
    new_token,
    pooled_producer,
    with_retry,
)
from celery_ext._parking import parking_producer, wants_park
from ojs_adapters.errors import OjsBackendError
from ojs_adapters.runtime.delivery import Unpublished

#: ``SENDING.retry`` is the task id whose retry ``send_retry`` publishes in this thread:
#: ``OjsTask.apply_async`` passes that send through (its ``ojs`` header is built already;
#: reading it again costs each retry). Another send meanwhile (a signal handler's) is not it.
SENDING = threading.local()


def send_retry(task: Any, exc: BaseException | str | None, *, countdown: float, not_before: float,
               queue: str, max_retries: int | None, headers: Mapping[str, Any],
               args: Any = None, kwargs: Any = None) -> Retry:
    """The ``Retry`` Celery raises once the broker accepted the retry (tried in place on
    broker errors), with the body's ``args``/``kwargs`` if it gave any (``_self_retry``);
    ``exc`` may be a text, as Celery's ``Retry`` takes one.
    Raises ``OjsBackendError`` if the broker does not accept it, and ``Unpublished`` if it
    cannot be published for another reason (every try would fail)."""

    def publish(producer: Any) -> Retry:
        SENDING.retry = task.request.id
        try:
            Task.retry(task, args, kwargs, exc=exc, countdown=countdown, max_retries=max_retries,
                       retry=False, producer=producer,
                       headers={**headers, TOKEN_HEADER: new_token()})
        except Retry as sent:
            return sent
        except Reject as rejected:  # Task.retry's wrapping of a failed send
            reason = rejected.reason
            if isinstance(reason, NOT_THE_BROKER):  # a KombuError, yet no broker's
                raise Unpublishable(reason) from reason
            raise reason if isinstance(reason, Exception) else rejected from None
        finally:
            SENDING.retry = None
        raise AssertionError("Task.retry returned")  # pragma: no cover - it always raises

    def once() -> Retry:
        if not confirms(task.app) and not wants_park(task.app, not_before):
            with pooled_producer(task.app) as producer:  # no confirms to wait for
                return publish(producer)
        with confirming_connection(task.app) as conn:
            # a long countdown waits on the broker, not in a worker (RET-11, _parking)
            return publish(parking_producer(task.app, conn, queue=queue,
                                            not_before=not_before) or conn.Producer())

    try:
        sent: Retry = with_retry(task.app, once, operation="publish retry")
    except OjsBackendError:
        raise
    except Exception as error:  # not the broker (a router raises, kombu cannot encode it)
        raise Unpublished(encoder_cause(error)) from error
    return sent
