"""Translate retry settings written for other job systems into OJS retry policies.

Each ``from_<dialect>`` takes that system's options as plain data (no import of
the system itself) and returns a ``Migration``: the ``policy`` (or ``None`` when
OJS has no equivalent and nothing was guessed), ``notes`` naming every lossy or
approximate step, and ``fidelity`` comparing the old and new delay schedules,
retry by retry and over the total retry window. ``Migration.ok`` is false when
there is no policy or the translation is ``lossy``; ``Migration.verdict`` is
``approximate`` rather than ``ok`` when early retries come much sooner than the
source's (``Fidelity.hurried``).

>>> from ojs_adapters.migrate import from_sidekiq
>>> m = from_sidekiq({"retry": 5, "dead": False}, version="8.1")
>>> m.policy.max_attempts, m.policy.on_exhaustion, m.policy.backoff_strategy
(6, 'discard', 'exponential')
>>> m.ok, round(m.fidelity.rows[0].new.mean, 1), round(m.fidelity.window_ratio, 2)
(True, 16.5, 0.97)

Dialects: ``from_sidekiq``, ``from_faktory``, ``from_celery``, ``from_dramatiq``,
``from_bullmq``, ``from_temporal``, ``from_queue_backoff``; ``migrate_path``
reads files (JSON, YAML, and Sidekiq's ``.rb``) and directories (``scan_path`` also says
which files a directory scan passed over, and why).
"""

from ojs_adapters.migrate._fidelity import Band, Fidelity, FidelityRow
from ojs_adapters.migrate._files import (
    DIALECTS,
    Scan,
    load_document,
    migrate_path,
    migrate_text,
    scan_path,
)
from ojs_adapters.migrate._model import SEVERITIES, Migration, Note
from ojs_adapters.migrate._ruby import RubyJob, read_ruby
from ojs_adapters.migrate.bullmq import from_bullmq
from ojs_adapters.migrate.celery import from_celery
from ojs_adapters.migrate.dramatiq import from_dramatiq
from ojs_adapters.migrate.faktory import from_faktory
from ojs_adapters.migrate.queue_backoff import from_queue_backoff
from ojs_adapters.migrate.sidekiq import from_sidekiq
from ojs_adapters.migrate.temporal import from_temporal

__all__ = [
    "DIALECTS",
    "SEVERITIES",
    "Band",
    "Fidelity",
    "FidelityRow",
    "Migration",
    "Note",
    "RubyJob",
    "Scan",
    "from_bullmq",
    "from_celery",
    "from_dramatiq",
    "from_faktory",
    "from_queue_backoff",
    "from_sidekiq",
    "from_temporal",
    "load_document",
    "migrate_path",
    "migrate_text",
    "read_ruby",
    "scan_path",
]
