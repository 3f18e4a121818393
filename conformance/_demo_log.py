"""The frameworks' own output during ``ojs-retry demo``, kept in a log file, off the terminal.

While the demo runs, Celery's embedded worker puts a stderr handler on the root
logger, Dramatiq logs a traceback for every attempt that fails on purpose, and
kombu warns "No hostname was supplied" on ``memory://``. ``captured`` sends all
logging, ``warnings`` and stray ``sys.stderr`` writes to one file instead: the
reader sees only the demo's tables, and nothing is lost.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, redirect_stderr
from pathlib import Path
from typing import Any

#: How each captured log line reads.
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(threadName)s] %(message)s"


@contextmanager
def captured(path: Path, level: int = logging.INFO) -> Iterator[None]:
    """Inside the block, append logging, warnings and ``sys.stderr`` output to ``path``.

    Example::

        with captured(Path("demo.log")):
            driver.start(scenarios)
    """
    root = logging.getLogger()
    handlers, root_level = root.handlers[:], root.level
    with path.open("a", encoding="utf-8") as stream, ExitStack() as undo:
        handler = logging.StreamHandler(stream)
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        root.handlers = [handler]
        root.setLevel(level)
        undo.callback(_restore, root, handlers, root_level)
        logging.captureWarnings(True)
        undo.callback(logging.captureWarnings, False)
        undo.enter_context(_celery_leaves_logging_alone())
        undo.enter_context(redirect_stderr(stream))
        yield


def append_file(path: Path, source: Path) -> None:
    """Copy ``source`` (a worker subprocess's log) to the end of ``path``, under its name."""
    text = source.read_text(encoding="utf-8", errors="replace")
    if text:
        with path.open("a", encoding="utf-8") as out:
            out.write(f"----- {source.name} -----\n{text}\n")


def _restore(root: logging.Logger, handlers: list[logging.Handler], level: int) -> None:
    root.handlers = handlers
    root.setLevel(level)


@contextmanager
def _celery_leaves_logging_alone() -> Iterator[None]:
    # Celery configures logging (a stderr handler on the root logger, bound to
    # sys.__stderr__) unless something listens to its setup_logging signal.
    try:
        from celery.signals import setup_logging
    except ImportError:  # no Celery installed: nothing to keep out
        yield
        return
    setup_logging.connect(_ignore, weak=False)
    try:
        yield
    finally:
        setup_logging.disconnect(_ignore)


def _ignore(**_: Any) -> None:
    """A ``setup_logging`` receiver that does nothing: logging is already set up."""
