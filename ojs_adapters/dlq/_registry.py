"""Finding a framework's dead-letter backend: the entry-point group ``ojs_adapters.dlq``.

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
from collections.abc import Mapping, Sequence
from importlib.metadata import entry_points
from typing import Any, Protocol

from ojs_adapters.dlq._queue import DeadLetterQueue

#: The entry-point group adapters register their ``Opener`` under.
ENTRY_POINT_GROUP = "ojs_adapters.dlq"


class Opener(Protocol):
    """Opens a framework's dead letters.

    ``app`` is ``"module:attribute"`` naming the user's app or broker object;
    ``broker`` a broker URL; ``queues`` the queues to look at when the broker
    cannot list them (RabbitMQ); ``options`` framework-specific settings
    (for example Dramatiq's Redis ``namespace``).
    """

    def __call__(self, *, app: str | None = None, broker: str | None = None,
                 queues: Sequence[str] = (),
                 options: Mapping[str, str] | None = None) -> DeadLetterQueue: ...


def frameworks() -> list[str]:
    """The frameworks with an installed dead-letter backend (metadata only)."""
    return sorted({ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})


def open_dead_letter_queue(framework: str, *, app: str | None = None, broker: str | None = None,
                           queues: Sequence[str] = (),
                           options: Mapping[str, str] | None = None) -> DeadLetterQueue:
    """The ``DeadLetterQueue`` of ``framework`` (``"celery"`` or ``"dramatiq"``).

    Raises ``LookupError`` when no adapter for it is installed.
    """
    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == framework]
    if not found:
        raise LookupError(f"no dead-letter backend for {framework!r}; installed: "
                          f"{', '.join(frameworks()) or 'none'}")
    opener: Opener = found[0].load()
    return opener(app=app, broker=broker, queues=queues, options=options or {})


def load_object(spec: str) -> Any:
    """The object ``"package.module:attr.sub"`` names (for ``--app``).

    >>> load_object("ojs_adapters.dlq:DeadLetters").__name__
    'DeadLetters'
    """
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"{spec!r} is not 'module:attribute'")
    found: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        found = getattr(found, part)
    return found
