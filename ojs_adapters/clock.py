"""The clock's stamps: timezone-aware UTC now, and ISO 8601 text of a moment (millisecond
precision, ``Z``), cheap enough for the decision path (ojs-retry.md section 10.1 times).

>>> iso_utc(datetime(2026, 2, 15, 10, 30, tzinfo=timezone.utc))
'2026-02-15T10:30:00.000Z'
"""

from __future__ import annotations

import time
from datetime import datetime, timezone


def utc_now() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(timezone.utc)


def iso_utc(moment: datetime) -> str:
    """``2026-02-15T10:30:00.123Z``: ISO 8601, UTC, millisecond precision."""
    return moment.astimezone(timezone.utc).isoformat(timespec="milliseconds")[:-6] + "Z"


class _SecondStampCache:
    """The last whole second ``iso_from_epoch`` formatted, and its text: formatting the
    second is most of the cost of a stamp, and stamps come in bursts within one second.

    One ``(second, text)`` tuple, replaced whole: threads racing on it may format a
    second twice, but never pair one second with another's text.
    """

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last: tuple[int, str] = (-1, "")

    def text_of(self, whole: int) -> str:
        """``YYYY-MM-DDTHH:MM:SS`` (UTC) of the POSIX second ``whole``."""
        second, text = self.last
        if second != whole:
            text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
            self.last = (whole, text)
        return text


#: Last-stamp cache of ``iso_from_epoch`` (per process; the core's only mutable state).
_SECOND_STAMPS = _SecondStampCache()


def iso_from_epoch(seconds: float) -> str:
    """``iso_utc`` for a POSIX timestamp, cheap enough for the decision path.

    >>> iso_from_epoch(1771151400.25)
    '2026-02-15T10:30:00.250Z'
    """
    whole = int(seconds)
    return "%s.%03dZ" % (_SECOND_STAMPS.text_of(whole),  # noqa: UP031 - fastest here
                         (seconds - whole) * 1000)
