"""What ``OjsRetries`` says once, at declaration or worker start, when a setup changes behaviour.

DESIGN.md "Nothing degrades silently": a guarantee the setup turns off is logged
once, naming what is off and the fix, never per message. Three notices live here:

- ``replaced_retries``: OjsRetries takes the slot of Dramatiq's ``Retries``. With
  Dramatiq's default ``Retries()`` (in every broker built with the defaults) that is
  what adding ``OjsRetries`` means, so it is a DEBUG line; the settings of a ``Retries``
  the user configured carry over as every actor's native defaults (an INFO line naming
  them); what cannot (``retry_when``, a subclass's code, ``max_retries=None``) is a
  WARNING naming the fix.
- ``check_store``: at worker start, a record store that keeps records in this process
  only (no ``Results`` and no Redis on a ``RabbitmqBroker``, an in-process results
  backend), or keeps no claims or leases (a ``Results`` backend other than Redis).
- ``check_prometheus``: at worker start, Dramatiq's own ``Prometheus`` middleware, which
  miscounts beside ``OjsRetries`` (``dramatiq_ext.prometheus``).
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

from dramatiq.broker import Broker
from dramatiq.brokers.stub import StubBroker

from dramatiq_ext._native import NativeDefaults
from dramatiq_ext.stores import MemoryRecordStore, ResultsRecordStore

#: The fix named by every store notice.
_STORE_FIX = ("give OjsRetries(store=RedisRecordStore(url=...)), or add Dramatiq's Results "
              "middleware with a RedisBackend")
#: Registry of the brokers whose store was checked in this process (one notice each).
_CHECKED: weakref.WeakSet[Broker] = weakref.WeakSet()


def replaced_retries(native: NativeDefaults, lost: list[str]) -> tuple[int, str]:
    """The level and text of the notice that ``OjsRetries`` took a ``Retries``' slot, given
    the settings it carries over (``_native.defaults_of``) and what it cannot.

    >>> from dramatiq.middleware import Retries
    >>> from dramatiq_ext._native import defaults_of
    >>> replaced_retries(*defaults_of(Retries()))[0] == logging.DEBUG
    True
    >>> replaced_retries(*defaults_of(Retries(max_retries=5)))[0] == logging.INFO
    True
    >>> replaced_retries(*defaults_of(Retries(retry_when=bool)))[0] == logging.WARNING
    True
    """
    if not native.custom:
        return logging.DEBUG, "one retry engine at a time (it had Dramatiq's defaults)."
    kept = (f"its max_retries={native.max_retries}, min_backoff={native.min_backoff}, "
            f"max_backoff={native.max_backoff} are kept as every actor's native defaults, "
            "translated as `ojs-retry migrate --from dramatiq` does (an actor's own options, "
            "its retry_policy and the fields OjsRetries(default_policy=...) states win)")
    if not lost:
        return logging.INFO, kept + "."
    return logging.WARNING, f"{kept}; but {'; '.join(lost)}."


def check_store(broker: Broker, store: Any, logger: logging.Logger) -> None:
    """Warn, once per broker and process, about the guarantees ``store`` turns off."""
    if broker in _CHECKED:
        return
    _CHECKED.add(broker)
    gaps = store_gaps(broker, store)
    if gaps:
        logger.warning("OjsRetries on %s with %s: %s. To keep them, %s.",
                       type(broker).__name__, _describe(store), "; ".join(gaps), _STORE_FIX)


def check_prometheus(broker: Broker, logger: logging.Logger) -> None:
    """Warn, as a worker starts, that Dramatiq's ``Prometheus`` (not a subclass) miscounts
    beside ``OjsRetries``, naming the replacement. Checked by name: importing Dramatiq's
    module creates its metrics directory."""
    if any(type(m).__name__ == "Prometheus"
           and type(m).__module__ == "dramatiq.middleware.prometheus" for m in broker.middleware):
        logger.warning(
            "Dramatiq's Prometheus middleware miscounts beside OjsRetries (in-progress below "
            "0 after dead letters, the dead-letter hop counted as a message, no retries "
            "counted): add dramatiq_ext.prometheus.OjsPrometheus() instead; same metrics.")


def store_gaps(broker: Broker, store: Any) -> list[str]:
    """The guarantees ``store`` turns off on ``broker``; empty for a shared, durable store.

    A ``StubBroker`` lives in one process: its memory store turns nothing off.

    >>> store_gaps(StubBroker(), MemoryRecordStore())
    []
    """
    if isinstance(broker, StubBroker):
        return []
    if _in_process(store):
        return ["job records are kept in this process only (get_job_record in a sender or "
                "another worker returns None)",
                "worker-crash counting is off (a crashed attempt comes back unseen and runs "
                "again without consuming an attempt)",
                "leases and claims hold within this process only (two workers may run "
                "copies of one attempt)"]
    gaps = []
    if not _keeps(store, "claim"):
        gaps.append("claims are off (two copies of one attempt may both run)")
    if not _keeps(store, "lease"):
        gaps.append("leases are off (a second delivery of a running attempt is taken for "
                    "a crashed worker)")
    return gaps


def _in_process(store: Any) -> bool:
    if isinstance(store, MemoryRecordStore):
        return True
    if isinstance(store, ResultsRecordStore):
        from dramatiq.results.backends import StubBackend

        return isinstance(store.backend, StubBackend)
    return False


def _keeps(store: Any, what: str) -> bool:
    """Whether ``store`` keeps claims (``"claim"``) or leases (``"lease"``) across processes."""
    if isinstance(store, ResultsRecordStore):  # has both methods; they work on Redis only
        client = getattr(store.backend, "client", None)
        return hasattr(client, "set" if what == "claim" else "register_script")
    return callable(getattr(store, what, None))


def _describe(store: Any) -> str:
    if isinstance(store, ResultsRecordStore):
        return f"job records in its {type(store.backend).__name__} (Results)"
    return f"job records in a {type(store).__name__}"
