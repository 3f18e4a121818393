"""A daemon thread that runs one step every few seconds and never dies of an error.

The parked-retry movers of both adapters run on it: a mover thread that died on a
broker error would leave every parked retry waiting, so an error is logged (once per
outage, not once per round), ``on_error`` gets a chance to drop a broken connection,
and the next round tries again.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable


class Periodic:
    """Call ``step()`` every ``interval`` seconds from a daemon thread named ``name``.

    >>> calls = []
    >>> runner = Periodic("demo", lambda: calls.append(1), 0.01)
    >>> runner.start(); runner.stop(); len(calls) >= 1
    True
    """

    def __init__(self, name: str, step: Callable[[], object], interval: float, *,
                 on_error: Callable[[], None] | None = None,
                 logger: logging.Logger | None = None) -> None:
        self.name = name
        self.step = step
        self.interval = interval
        self.on_error = on_error
        # the logger name it had before the runtime split
        self.logger = logger or logging.getLogger("ojs_adapters._periodic")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        """Whether the thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start the thread (a no-op while it runs)."""
        if self.running:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True, name=self.name)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread, waiting up to ``timeout`` seconds for its current step."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._thread = None

    def _run(self) -> None:
        failing = False
        while not self._stop.is_set():
            try:
                self.step()
                failing = False
            except Exception as error:  # the thread must outlive any outage
                if not failing:
                    self.logger.warning("%s: %r; trying again every %.1f s", self.name, error,
                                        self.interval)
                failing = True
                if self.on_error is not None:
                    with contextlib.suppress(Exception):  # e.g. closing a broken link
                        self.on_error()
            self._stop.wait(self.interval)
