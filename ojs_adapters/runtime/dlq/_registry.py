"""Finding a framework's dead-letter backend: the entry-point group ``ojs_adapters.runtime.dlq``.

The core never imports Celery, Dramatiq or kombu. Each adapter declares an entry
point whose object is an ``Opener``, a function returning a ``DeadLetterQueue``::

    [project.entry-points."ojs_adapters.dlq"]
    dramatiq = "dramatiq_ext.dlq:open_dead_letter_queue"

and the core loads it by framework name only when asked.

>>> "dramatiq" in frameworks()
True
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from importlib.metadata import entry_points
from typing import Any, Protocol

from ojs_adapters.runtime.dlq._queue import DeadLetterQueue

#: The entry-point group adapters register their ``Opener`` under.
ENTRY_POINT_GROUP = "ojs_adapters.dlq"


class Opener(Protocol):
    """Opens a framework's dead letters.

    ``app`` is ``"module:attribute"`` (or ``"module"``, as the framework's own CLI
    reads it) naming the user's app or broker object; ``broker`` a broker URL;
    ``queues`` queues to look at beyond those found; ``options`` framework-specific
    settings (Dramatiq's Redis ``namespace``; ``management``, the RabbitMQ
    management API's URL or ``none``).
    """

    def __call__(self, *, app: str | None = None, broker: str | None = None,
                 queues: Sequence[str] = (),
                 options: Mapping[str, str] | None = None) -> DeadLetterQueue: ...


class OriginalQueueWanted(ValueError):
    """A queue to look at is one a framework makes of another (its dead-letter or delay
    queue): dead letters are looked up by the queue a job was sent to, ``original``
    (``None`` for a queue every queue shares). ``what`` says what ``queue`` is."""

    def __init__(self, queue: str, original: str | None, what: str) -> None:
        self.queue, self.original, self.what = queue, original, what
        name = f", {original!r}" if original else ""
        super().__init__(f"{queue!r} is {what}: name the original queue{name}")

    def pass_instead(self) -> str:
        """The command line's words: what ``queue`` is, and the ``--queue`` to pass."""
        original = f"--queue {self.original}" if self.original else "an original --queue"
        return f"{self.queue!r} is {self.what}: pass {original}"


class DeadLetterQueueGiven(OriginalQueueWanted):
    """A queue to look at is itself a dead-letter queue: adapters take original queues.

    ``original`` is the queue it holds the dead letters of (``None`` for a name every
    queue shares). Without this, the adapter looks for the dead-letter queue *of* that
    dead-letter queue and finds nothing.

    >>> str(DeadLetterQueueGiven("q.XQ", "q"))
    "'q.XQ' is the dead-letter queue of 'q': name the original queue, 'q'"
    """

    def __init__(self, queue: str, original: str | None) -> None:
        of = f"of {original!r}" if original else "every queue shares"
        super().__init__(queue, original, f"the dead-letter queue {of}")


class DelayQueueGiven(OriginalQueueWanted):
    """A queue to look at is Dramatiq's delay queue (``<queue>.DQ``), where messages wait
    out a delay (a retry's backoff, ``send_with_options(delay=...)``): it never holds dead
    letters, and its own dead-letter queue does not exist.

    >>> DelayQueueGiven("q.DQ", "q").pass_instead()  # doctest: +ELLIPSIS
    "'q.DQ' is Dramatiq's delay queue of 'q' (...): pass --queue q"
    """

    def __init__(self, queue: str, original: str) -> None:
        super().__init__(queue, original, f"Dramatiq's delay queue of {original!r} (where "
                         "messages wait out a retry's or a send's delay; dead letters go to "
                         f"{original + '.XQ'!r})")


def refuse_delay_queues(framework: str, queues: Iterable[str]) -> None:
    """``DelayQueueGiven`` for the first of ``queues`` that is a Dramatiq delay queue
    (``<queue>.DQ``, Dramatiq's naming) when ``framework`` is ``"dramatiq"``.

    >>> refuse_delay_queues("celery", ["q.DQ"])  # Celery makes no such queue
    """
    if framework != "dramatiq":
        return
    for name in queues:
        if name.endswith(".DQ") and len(name) > 3:
            raise DelayQueueGiven(name, name[:-3])


def read_options(framework: str, items: Iterable[str]) -> dict[str, str]:
    """``KEY=VALUE`` items as the ``options`` of ``framework``'s opener; ``ValueError`` naming
    an item without ``=`` or a key the adapter does not read (it would be ignored).

    The keys are the ``OPTION_KEYS`` of the module holding the framework's ``Opener``; a
    framework whose module states none, or cannot be imported (its extras are missing: the
    opener says so), takes any key.

    >>> read_options("celery", ["management=none"])
    {'management': 'none'}
    >>> read_options("celery", ["namespace=x"])
    Traceback (most recent call last):
    ValueError: unknown key 'namespace' for celery; valid keys: backend, management
    """
    known = _option_keys(framework)
    found: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{item!r} is not KEY=VALUE")
        if known is not None and key not in known:
            raise ValueError(f"unknown key {key!r} for {framework}; valid keys: "
                             f"{', '.join(known)}")
        found[key] = value
    return found


def frameworks() -> list[str]:
    """The frameworks with an installed dead-letter backend (metadata only)."""
    return sorted({ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})


def open_dead_letter_queue(framework: str, *, app: str | None = None, broker: str | None = None,
                           queues: Sequence[str] = (),
                           options: Mapping[str, str] | None = None) -> DeadLetterQueue:
    """The ``DeadLetterQueue`` of ``framework`` (``"celery"`` or ``"dramatiq"``).

    Raises ``LookupError`` when no adapter for it is installed, ``OriginalQueueWanted``
    when ``queues`` names a dead-letter or delay queue instead of an original one.
    """
    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == framework]
    if not found:
        raise LookupError(f"no dead-letter backend for {framework!r}; installed: "
                          f"{', '.join(frameworks()) or 'none'}")
    refuse_delay_queues(framework, queues)
    opener: Opener = found[0].load()
    return opener(app=app, broker=broker, queues=queues, options=options or {})


def load_object(spec: str) -> Any:
    """The object ``"package.module:attr.sub"`` names, or the module ``"package.module"``.

    The current directory is put first on ``sys.path`` while importing, as
    ``celery -A`` and ``dramatiq`` do, so ``--app app:app`` works from the app's
    own folder (a console script's ``sys.path`` starts at its own ``bin``).

    >>> load_object("ojs_adapters.runtime.dlq:DeadLetters").__name__
    'DeadLetters'
    """
    module_name, _, attribute = spec.partition(":")
    if not module_name:
        raise ValueError(f"{spec!r} is not 'module' or 'module:attribute'")
    with cwd_on_path(), named_module_hint(module_name):
        found: Any = importlib.import_module(module_name)
    for part in filter(None, attribute.split(".")):
        found = getattr(found, part)
    return found


@contextmanager
def named_module_hint(module: str, *, last_may_be_attribute: bool = False
                      ) -> Iterator[None]:
    """Say where to run from when importing ``module`` (an ``--app``) finds no such module;
    ``last_may_be_attribute``: ``tasks.app`` may be module ``tasks``'s ``app`` (``celery -A``).

    Only when what is missing is ``module`` itself, or the top package of a dotted one
    (not on ``sys.path``: the wrong folder). A missing submodule of a package that was
    found, or a module the app imports, keeps Python's message.

    >>> with named_module_hint("nosuchapp"):  # doctest: +ELLIPSIS
    ...     importlib.import_module("nosuchapp")
    Traceback (most recent call last):
    ModuleNotFoundError: No module named 'nosuchapp': run it from the folder that holds ...
    """
    try:
        yield
    except ModuleNotFoundError as exc:
        top = module.partition(".")[0]
        if not top or exc.name != top:
            raise
        where = f"{top}.py" if top == module else \
            f"{top}.py or {top}/" if last_may_be_attribute else f"{top}/"
        raise ModuleNotFoundError(f"{exc}: run it from the folder that holds {where}, or put "
                                  "that folder on PYTHONPATH", name=top) from exc


@contextmanager
def cwd_on_path() -> Iterator[None]:
    """Put the current directory first on ``sys.path`` for the block (if it is not there)."""
    try:
        cwd = os.getcwd()
    except FileNotFoundError:  # the directory was removed under us
        cwd = ""
    if not cwd or cwd in sys.path:
        yield
        return
    sys.path.insert(0, cwd)
    try:
        yield
    finally:
        with suppress(ValueError):
            sys.path.remove(cwd)


def _option_keys(framework: str) -> tuple[str, ...] | None:
    """The ``OPTION_KEYS`` of ``framework``'s opener module, where it states them."""
    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == framework]
    if not found:
        return None
    try:
        module = importlib.import_module(found[0].module)
    except ImportError:
        return None
    keys = getattr(module, "OPTION_KEYS", None)
    return tuple(keys) if isinstance(keys, (tuple, list)) else None
