"""What Dramatiq's own retry settings become under ``OjsRetries`` (DESIGN.md "Native parity").

An actor stating a Dramatiq retry option (``max_retries``, ``min_backoff``,
``max_backoff``, ``throws``) keeps Dramatiq's outcome for what it leaves out: natively
those come from the broker's ``Retries`` (Dramatiq's stock 20 retries, 15 s, 7 days,
or the ones a user gave ``Retries(...)``). The options, filled in from those defaults,
are translated by ``ojs_adapters.migrate.from_dramatiq``, the very translation
``ojs-retry migrate --from dramatiq`` prints: one source of truth for the schedule.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import dramatiq
from dramatiq.middleware import Retries

from ojs_adapters.failure import error_type_of
from ojs_adapters.migrate.dramatiq import (
    DEFAULT_MAX_BACKOFF_MS,
    DEFAULT_MAX_RETRIES,
    DEFAULT_MIN_BACKOFF_MS,
    from_dramatiq,
)

#: The policy fields the translation sets, and the Dramatiq option each one comes from
#: (``None``: from Dramatiq's nature, not from an option).
NATIVE_FIELDS: Mapping[str, str | None] = {
    "max_attempts": "max_retries", "initial_interval": "min_backoff",
    "max_interval": "max_backoff", "non_retryable_errors": "throws",
    "on_exhaustion": None, "backoff_strategy": None, "backoff_coefficient": None,
    "jitter": None,
}


class NativeDefaults(NamedTuple):
    """The ``Retries`` settings an actor's unstated native options fall back on.

    ``custom``: a user configured them (``Retries(max_retries=5)``), so they are the
    native outcome of every actor, as they were before ``OjsRetries`` replaced it.
    """

    max_retries: int = DEFAULT_MAX_RETRIES
    min_backoff: int = DEFAULT_MIN_BACKOFF_MS
    max_backoff: int = DEFAULT_MAX_BACKOFF_MS
    custom: bool = False


#: Dramatiq's stock ``Retries()`` settings.
STOCK = NativeDefaults()


def defaults_of(retries: Retries) -> tuple[NativeDefaults, list[str]]:
    """The native defaults ``retries`` gave every actor, and what of it cannot carry over.

    >>> defaults_of(Retries(max_retries=5))
    (NativeDefaults(max_retries=5, min_backoff=15000, max_backoff=604800000, custom=True), [])
    >>> defaults_of(Retries(retry_when=lambda n, e: n < 2))[1][0][:33]
    'retry_when is code (a predicate):'
    """
    lost = []
    if type(retries) is not Retries:
        lost.append(f"{type(retries).__qualname__} is a subclass of Retries: its own code "
                    "no longer runs")
    if getattr(retries, "retry_when", None) is not None:
        lost.append("retry_when is code (a predicate): it no longer runs, and no OJS policy "
                    "can hold it. Raise JobError(..., code='DISCARD') where it said stop, "
                    "or list those error types in non_retryable_errors, and state "
                    "OjsRetries(default_policy={'max_attempts': N})")
    count = getattr(retries, "max_retries", DEFAULT_MAX_RETRIES)
    if count is None:
        lost.append("max_retries=None retries for ever; OJS max_attempts is a bound "
                    "(RET-01): actors get Dramatiq's 20 unless default_policy states "
                    "max_attempts")
        count = DEFAULT_MAX_RETRIES
    found = NativeDefaults(count, getattr(retries, "min_backoff", DEFAULT_MIN_BACKOFF_MS),
                           getattr(retries, "max_backoff", DEFAULT_MAX_BACKOFF_MS))
    return found._replace(custom=bool(lost) or found != STOCK), lost


def native_policy_fields(options: Mapping[str, Any], defaults: NativeDefaults) -> dict[str, Any]:
    """The policy fields native Dramatiq gives an actor with ``options`` (validated ones).

    What the actor leaves out comes from ``defaults``; the fields are those
    ``ojs-retry migrate --from dramatiq`` gives for the filled-in options.

    >>> fields = native_policy_fields({"throws": (KeyError,)}, STOCK)
    >>> fields["max_attempts"], fields["initial_interval"], fields["non_retryable_errors"]
    (21, 'PT22.5S', ['KeyError'])
    """
    throws = options.get("throws") or ()
    classes = throws if isinstance(throws, tuple) else (throws,)
    source: dict[str, Any] = {
        "max_retries": options.get("max_retries", defaults.max_retries),
        "min_backoff": _millis(options.get("min_backoff", defaults.min_backoff)),
        "max_backoff": _millis(options.get("max_backoff", defaults.max_backoff)),
        "throws": [error_type_of(k) for k in classes],
    }
    migration = from_dramatiq(source, version=dramatiq.__version__)
    assert migration.policy is not None  # a bounded count always gives a policy
    full = migration.policy.to_dict()
    return {field: full[field] for field in NATIVE_FIELDS}


def _millis(value: Any) -> int:
    """Dramatiq takes float milliseconds too; the translation takes whole ones."""
    return value if isinstance(value, int) else max(1, math.ceil(value))
