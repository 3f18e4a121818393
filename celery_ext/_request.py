"""``OjsRequest``: the worker main process's side of an ``OjsTask`` delivery.

What only the main process can do: publish a dead letter before the ack (``_deadletter``;
if the broker refuses it, the message is requeued and its redelivery tries again, RET-17);
requeue a delivery that hit its hard time limit, marked in the record so that the
redelivery records ``HANDLER_TIMEOUT``; hold each delivery in the Redis visibility
heartbeat (``_heartbeat``, RET-13); and make a retry back from the RabbitMQ delay levels a
delivery to its queue again. Why: docs/lifecycle.md.
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from typing import Any

from billiard.einfo import ExceptionWithTraceback
from celery.exceptions import TimeLimitExceeded
from celery.worker.request import Request
from celery.worker.state import task_ready

from celery_ext import _deadletter
from celery_ext import _publish_ride as publish_ride
from celery_ext._alerts import dead_lettered
from celery_ext._deadletter import publish_dead_letter
from celery_ext._handoff import with_retry
from celery_ext._headers import HeaderState
from celery_ext._heartbeat import hold
from celery_ext._internal_error import dead_letter_of
from celery_ext._parking import restore_delivery_info
from celery_ext.exceptions import JobDeadLettered
from celery_ext.records import RecordStore
from ojs_adapters.runtime.backend_retry import backend_error, count_failure
from ojs_adapters.runtime.handoff import handed_off

logger = logging.getLogger("celery_ext")


class OjsRequest(Request):  # type: ignore[misc]  # celery ships no type hints
    """Celery's ``Request`` plus dead-letter publishing, hard-time-limit requeueing and the
    visibility heartbeat."""

    def __init__(self, message: Any, *args: Any, **kwargs: Any) -> None:
        app = kwargs.get("app") or getattr(kwargs.get("task"), "app", None)
        if app is not None:  # a retry back from the RabbitMQ delay levels names its queue
            restore_delivery_info(message, app)
        super().__init__(message, *args, **kwargs)
        hold(message, self.task.app)  # until acked, on Redis (RET-13)

    def on_failure(self, exc_info: Any, send_failed_event: bool = True,
                   return_ok: bool = False) -> None:
        exc = exc_info.exception
        if isinstance(exc, ExceptionWithTraceback):
            exc = exc.exc
        if getattr(exc_info, "internal", False):  # Celery could not store the outcome
            exc = dead_letter_of(exc) or exc
        if isinstance(exc, JobDeadLettered) and not self._dead_letter(exc):
            task_ready(self)
            self.reject(requeue=True)
            return
        if isinstance(exc, TimeLimitExceeded) and self.task.acks_late:
            self._requeue_timed_out(exc.args[0] if exc.args else None)
            return
        super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)

    def on_timeout(self, soft: bool, timeout: float) -> None:
        if soft or not self.task.acks_late:
            super().on_timeout(soft, timeout)
            return
        self._requeue_timed_out(timeout)

    def _dead_letter(self, exc: JobDeadLettered) -> bool:
        """Publish the dead letter and mark it in the record; ``False`` (logged) if it could
        not be published."""
        queue = str(exc.record.extra.get("dead_letter_queue") or "")
        store = RecordStore(self.task.backend)
        # The mark rides in the MULTI after the dead letter's push when broker and backend
        # are one Redis (``_publish_ride``); else it is saved alone below.
        store.save_with_publish(self.task.app, handed_off(exc.record), queue, first=False)
        try:
            published = self._publish_dead_letter(queue, exc)
        finally:
            marked, stray = publish_ride.settle()
        if not published:
            if stray:  # the push refused inside EXEC, the mark applied: take it back
                self._unmark(store, exc)
            return False
        logger.info("%s[%s]: dead-lettered to %r", self.name, self.id, queue)
        dead_lettered(exc.record, queue)  # the on_dead_letter hooks (ojs_adapters.runtime.alerts)
        if marked:
            return True
        try:  # a redelivery of the original now knows the dead letter landed
            with_retry(self.task.app, lambda: store.save(handed_off(exc.record)),
                       operation="write job record")
        except Exception:
            count_failure("write job record", "failed")
            logger.warning("%s[%s]: cannot mark the dead letter in the job record",
                           self.name, self.id, exc_info=True)
        return True

    def _unmark(self, store: RecordStore, exc: JobDeadLettered) -> None:
        """The record without the dead letter's mark, so that the redelivery publishes it."""
        try:
            with_retry(self.task.app, lambda: store.save(exc.record),
                       operation="write job record")
        except Exception:
            count_failure("write job record", "failed")
            logger.warning("%s[%s]: cannot take back the dead letter's mark in the job record",
                           self.name, self.id, exc_info=True)

    def _publish_dead_letter(self, queue: str, exc: JobDeadLettered) -> bool:
        """The dead letter, or the original as it came when the full one cannot be
        published for a reason other than the broker; ``False`` (logged) if neither was."""
        try:
            publish_dead_letter(self.task.app, self._message, queue, exc.record)
        except Exception as error:
            if backend_error(error) is not None:
                logger.exception("%s[%s]: could not publish to dead-letter queue %r; "
                                 "requeueing", self.name, self.id, queue)
                return False
            logger.error("%s[%s]: could not publish the dead letter to %r (%s: %s); "
                         "dead-lettering the original as it came", self.name, self.id, queue,
                         type(error).__name__, error, exc_info=error)
            try:
                # the module's own function: no OJS headers this time, just the original
                _deadletter.publish_dead_letter(self.task.app, self._message, queue, None)
            except Exception:
                logger.exception("%s[%s]: could not publish to dead-letter queue %r; "
                                 "requeueing", self.name, self.id, queue)
                return False
        return True

    def _requeue_timed_out(self, timeout: Any) -> None:
        """Mark the attempt as timed out in the record and requeue the message (once)."""
        if self.acknowledged:
            return  # on_failure and on_timeout both report one hard time limit
        task_ready(self)
        if _pool_process_exited(self.worker_pid):
            # The process died on its own before its limit (the pool notices a death only
            # when it next looks): a crash, which the redelivery records as HANDLER_PANIC.
            logger.warning("%s[%s]: pool process %s died before the hard time limit fired; "
                           "requeued to record a lost worker", self.name, self.id,
                           self.worker_pid)
            self.reject(requeue=True)
            return
        attempt = HeaderState.from_headers(self._request_dict).attempt
        message = f"hard time limit ({timeout}s) exceeded"
        logger.warning("%s[%s]: %s in attempt %d; requeued to record HANDLER_TIMEOUT",
                       self.name, self.id, message, attempt)
        store = RecordStore(self.task.backend)
        try:
            record = store.load(self.id)
            if record is not None and record.state == "active" and record.attempt == attempt:
                lost = {"attempt": attempt, "timeout": timeout, "message": message}
                store.save(replace(record, extra={**record.extra, "lost": lost}))
        except Exception:
            logger.warning("%s[%s]: cannot mark the time limit in the job record",
                           self.name, self.id, exc_info=True)
        self.reject(requeue=True)


def _pool_process_exited(pid: int | None) -> bool:
    """Whether pool process ``pid`` has already exited (checked without reaping it).

    A hard time limit fires from a timer, and billiard kills the process only
    after this request's callbacks ran; a process already gone by then died of
    something else (SIGKILL, OOM, segfault) that the pool has not noticed yet.
    """
    if not pid or not hasattr(os, "waitid"):
        return False
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # reaped already, or not our child: is it still there?
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except OSError:
            return False
        return False
