"""The Go job queue of ``spec/queue-retry-backoff.md`` to an OJS RetryPolicy.

``MaxRetries`` counts retries (default 3, so 4 attempts; 0 means none).
``RetryBackoffBaseMS`` (500) doubles per retry up to ``RetryBackoffMaxMS``
(30 000), and the delay is drawn with *full jitter*, uniform in [0, that
value]. A job out of retries stays in the store in state ``Failed`` for manual
or dead-letter handling: ``on_exhaustion`` is ``dead_letter``. The OJS policy
halves the base and the cap, so its expected delays (OJS jitter's mean is the
delay itself) match the queue's (full jitter's mean is half the delay).

>>> m = from_queue_backoff({"MaxRetries": 2, "RetryBackoffBaseMS": 1000})
>>> (m.policy.max_attempts, m.policy.schedule(), m.ok)
(3, [0.5, 1.0], True)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ojs_adapters.migrate._common import (
    MAX_INTERVAL_S,
    Notes,
    compared,
    full_jitter_band,
    get_int,
    iso_seconds,
    judged,
    normalize,
    note_ignored,
    policy_from,
    positive_interval,
)
from ojs_adapters.migrate._model import Migration

DIALECT = "queue"
#: Defaults of the queue's ``Config``.
DEFAULT_MAX_RETRIES = 3
DEFAULT_BASE_MS = 500
DEFAULT_MAX_MS = 30_000
#: snake_case and short spellings accepted for the Go field names.
_ALIASES = {"max_retries": "MaxRetries", "retry_backoff_base_ms": "RetryBackoffBaseMS",
            "retry_backoff_max_ms": "RetryBackoffMaxMS", "BaseMS": "RetryBackoffBaseMS",
            "MaxMS": "RetryBackoffMaxMS"}


def from_queue_backoff(options: Mapping[str, Any] | None, *, name: str | None = None,
                       origin: str | None = None) -> Migration:
    """Translate one ``queue.Config`` (its retry fields) written as JSON or YAML."""
    opts = {_ALIASES.get(k, k): v for k, v in normalize(options, DIALECT).items()}
    notes = Notes()
    note_ignored(opts, {"MaxRetries", "RetryBackoffBaseMS", "RetryBackoffMaxMS"}, notes)
    retries = get_int(opts, "MaxRetries", DIALECT, default=DEFAULT_MAX_RETRIES, minimum=0)
    base_ms = get_int(opts, "RetryBackoffBaseMS", DIALECT, default=DEFAULT_BASE_MS, minimum=0)
    max_ms = get_int(opts, "RetryBackoffMaxMS", DIALECT, default=DEFAULT_MAX_MS, minimum=0)
    assert retries is not None and base_ms is not None and max_ms is not None
    initial = positive_interval(min(base_ms, max_ms) / 2000, "RetryBackoffBaseMS", notes)
    policy = policy_from({
        "max_attempts": retries + 1, "on_exhaustion": "dead_letter",
        "backoff_strategy": "exponential", "backoff_coefficient": 2.0, "jitter": True,
        "initial_interval": iso_seconds(initial),
        "max_interval": iso_seconds(min(max(max_ms / 2000, initial), MAX_INTERVAL_S)),
    })
    notes.add("info", "MaxRetries", f"{retries} retries: max_attempts {retries + 1} (OJS counts "
              "the first run)")
    notes.add("info", None, "exhausted jobs stay in the store as Failed, for dead-letter "
              "handling: on_exhaustion 'dead_letter'")
    if retries:
        notes.add("approximate", "jitter", "full jitter draws from [0, delay] (mean half of "
                  "it); OJS jitter draws from [0.5, 1.5) x delay. DESIGN.md keeps full jitter "
                  "an opt-in extension, so the policy uses the OJS multiplier with half the "
                  "base and cap: the expected delays match, and each wait falls in "
                  "[0.25, 0.75] x the queue's delay (never at once)")
    old = [full_jitter_band(min(base_ms * 2 ** min(n - 1, 64), max_ms) / 1000)
           for n in range(1, compared(retries) + 1)]
    fidelity = judged(old, policy, notes)
    return Migration(DIALECT, policy, tuple(notes), fidelity, {}, name, origin, opts)
