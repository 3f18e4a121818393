"""``OjsPrometheus``: Dramatiq's ``Prometheus`` middleware, counting as it does without us.

With ``OjsRetries`` in ``Retries``' place, Dramatiq's own ``Prometheus`` miscounts:

- the dead-letter hop (a copy ``OjsRetries`` fails unrun into ``.XQ`` on RabbitMQ and the
  ``StubBroker``) is skipped before ``Prometheus.before_process_message`` runs, yet its
  ``after_skip_message`` runs: ``dramatiq_messages_inprogress`` goes to -1 per dead
  letter, and ``dramatiq_messages_total`` counts one message more;
- a delivery ``OjsRetries`` stops unrun (a duplicate, one given back) does the same;
- ``dramatiq_message_retries_total`` stays 0: Dramatiq counts messages that carry its
  ``Retries``' ``retries`` option, which ours do not.

``OjsPrometheus`` takes ``Prometheus``' place and counts as Dramatiq does for the same
jobs under ``Retries``: in-progress goes up and down once per delivery it saw start,
``dramatiq_messages_total`` and ``dramatiq_message_errors_total`` count each attempt once
(the hop and unrun deliveries are no attempt; an attempt lost with its worker counts
once, as failed), and each retry counts on ``<queue>.DQ`` when it is decided (Dramatiq's
enqueue to the delay queue) and on ``<queue>`` when it runs (Dramatiq's move from the
delay queue): Dramatiq's own labels. Dead letters count once in
``dramatiq_message_rejects_total`` (the nack into ``.XQ``), as before.

>>> from dramatiq.brokers.stub import StubBroker
>>> broker = StubBroker()
>>> broker.add_middleware(OjsPrometheus())
"""

from __future__ import annotations

import threading
from typing import Any

from dramatiq.broker import Broker, MessageProxy
from dramatiq.common import dq_name, q_name
from dramatiq.middleware.prometheus import Prometheus

from dramatiq_ext._outcome import AttemptConsumed
from dramatiq_ext._state import MessageState
from dramatiq_ext._unrun import ADMITTED
from ojs_adapters.runtime.events import DecisionEvent, add_hook, remove_hook

__all__ = ["OjsPrometheus"]

#: Attribute of a ``MessageProxy`` whose in-progress count this middleware raised.
_STARTED = "_ojs_prometheus_started"
#: Attribute of a ``MessageProxy`` this middleware has counted (after hooks may run twice).
_COUNTED = "_ojs_prometheus_counted"
#: The ``OjsPrometheus`` of the broker whose worker thread this is: a decision reported on
#: it is that broker's (the decision hooks are process-wide).
_THREAD = threading.local()


class OjsPrometheus(Prometheus):
    """Dramatiq's ``Prometheus`` for a broker with ``OjsRetries``: add it instead of
    ``Prometheus`` (anywhere in the list); the metrics, names and labels are Dramatiq's."""

    def after_process_boot(self, broker: Broker) -> None:
        super().after_process_boot(broker)  # type: ignore[no-untyped-call]
        add_hook(self._on_decision)

    def after_worker_boot(self, broker: Broker, worker: Any) -> None:
        add_hook(self._on_decision)  # again for a worker started after one that stopped

    def after_worker_shutdown(self, broker: Broker, worker: Any) -> None:
        remove_hook(self._on_decision)
        super().after_worker_shutdown(broker, worker)  # type: ignore[no-untyped-call]

    def after_worker_thread_boot(self, broker: Broker, thread: Any) -> None:
        _THREAD.prometheus = self

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        if MessageState.of(message.options).dead_letter:
            return  # the hop to the dead-letter queue: not an attempt
        super().before_process_message(broker, message)  # type: ignore[no-untyped-call]
        vars(message)[_STARTED] = True

    def after_process_message(self, broker: Broker, message: MessageProxy, *,
                              result: Any = None, exception: BaseException | None = None) -> None:
        self._ended(broker, message, exception)

    # Dramatiq's is ``after_process_message`` itself; it is only called with these two.
    def after_skip_message(self, broker: Broker,  # type: ignore[override]
                           message: MessageProxy) -> None:
        self._ended(broker, message, None)

    def _ended(self, broker: Broker, message: MessageProxy,
               exception: BaseException | None) -> None:
        """Count a delivery once: an attempt as Dramatiq does, anything else not at all."""
        if vars(message).get(_COUNTED):
            return
        vars(message)[_COUNTED] = True
        state = MessageState.of(message.options)
        attempt = not state.dead_letter and not (
            isinstance(exception, AttemptConsumed) and not exception.failed)
        labels = (message.queue_name, message.actor_name)
        if vars(message).pop(_STARTED, False):
            if attempt:  # in-progress down, duration, total, errors: Dramatiq's own
                super().after_process_message(  # type: ignore[no-untyped-call]
                    broker, message, exception=exception)
            else:
                self.message_start_times.pop(message.message_id, None)
                self.inprogress_messages.labels(*labels).dec()
        elif attempt:  # stopped before our start hook, e.g. an attempt lost with its worker
            self.total_messages.labels(*labels).inc()
            if exception is not None:
                self.total_errored_messages.labels(*labels).inc()
        if vars(message).get(ADMITTED) and state.attempt > 1:  # a retry ran: off the .DQ
            self.total_retried_messages.labels(*labels).inc()

    def _on_decision(self, event: DecisionEvent) -> None:
        """A retry decided on this broker's worker thread: Dramatiq's enqueue to ``.DQ``."""
        if (event.framework == "dramatiq" and event.decision.action == "retry"
                and getattr(_THREAD, "prometheus", None) is self
                and hasattr(self, "total_retried_messages")):  # booted: metrics exist
            self.total_retried_messages.labels(dq_name(q_name(event.queue)), event.task).inc()
