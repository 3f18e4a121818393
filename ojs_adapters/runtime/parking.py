"""Parking: what both adapters share about long retries that wait on the broker (RET-11).

A retry whose delay is over a threshold waits on the broker (Celery: ``ojs_park_after``;
Dramatiq: ``OjsRetries(park_after=)``), not unacked in a worker, and comes back to a
worker at most ``LEAD`` seconds before it is due. The mechanisms are per framework and
broker (``celery_ext._parking``, ``dramatiq_ext._parking``, ``delay_levels``).

>>> park_threshold(300), park_threshold(0.2), park_threshold(None)
(300.0, 1.0, None)
>>> try:
...     park_threshold("soon", field="ojs_park_after")
... except OjsValidationError as error:
...     error.code, error.details["field"], error.details["rule"]
('INVALID_ARGS', 'ojs_park_after', 'a number of seconds > 0, or None to turn parking off')
"""

from __future__ import annotations

import math

from ojs_adapters.errors import OjsValidationError

#: Default threshold, seconds: a retry waiting longer is parked on the broker.
DEFAULT_PARK_AFTER = 60.0
#: Smallest threshold, seconds: a shorter one is raised to this (parking moves in seconds).
MIN_PARK_AFTER = 1.0
#: A parked retry reaches a worker at most this many seconds before it is due.
LEAD = 1.0
#: The rule ``park_threshold`` enforces, as ``details["rule"]`` says it.
RULE = "a number of seconds > 0, or None to turn parking off"


def park_threshold(value: object, *, field: str = "park_after") -> float | None:
    """``value`` as a parking threshold in seconds (at least ``MIN_PARK_AFTER``), ``None``
    (or ``False``) for parking off; anything else raises ``OjsValidationError``
    (``INVALID_ARGS``) naming ``field``."""
    if value is None or value is False:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or \
            not math.isfinite(value) or value <= 0:
        raise OjsValidationError(
            f"{field} must be {RULE}; got {value!r:.64}", code="INVALID_ARGS",
            details={"field": field, "value": f"{value!r:.64}", "rule": RULE})
    return max(MIN_PARK_AFTER, float(value))
