"""Where an ``OjsTask``'s retry policy comes from, and Celery's own retry options it refuses.

Precedence, each layer a partial policy merged over the one before (RET-10):
the OJS defaults (RET-09), then ``app.conf.ojs_default_retry_policy``, then the
task's ``retry_policy``, then a per-call ``apply_async(retry_policy=...)``.
Every layer is validated where it is given (RET-16): at task definition, at
send time, never first in the worker.

Celery's ``autoretry_for``, ``retry_backoff``, ``max_retries`` and friends
would make a second, different retry decision, so an ``OjsTask`` rejects them
with the ``retry_policy`` that says the same thing, rather than combining them.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from celery_ext._conf import setting
from ojs_adapters import OjsValidationError, RetryPolicy
from ojs_adapters.failure import error_type_of
from ojs_adapters.migrate import from_celery

#: The app setting holding the default policy of every OjsTask of the app.
APP_DEFAULT_SETTING = "ojs_default_retry_policy"

#: Celery retry options an OjsTask refuses, with what to write instead.
_CELERY_RETRY_OPTIONS: Mapping[str, str] = {
    "autoretry_for": "every exception already goes through the OJS policy; list permanent "
                     "ones in retry_policy['non_retryable_errors']",
    "dont_autoretry_for": "use retry_policy['non_retryable_errors']",
    "retry_kwargs": "use retry_policy (max_attempts, initial_interval, ...)",
    "retry_backoff": "use retry_policy={'backoff_strategy': 'exponential', "
                     "'initial_interval': 'PT<seconds>S', 'backoff_coefficient': 2.0}",
    "retry_backoff_max": "use retry_policy={'max_interval': 'PT<seconds>S'}",
    "retry_jitter": "use retry_policy={'jitter': true|false} (OJS jitter is x[0.5, 1.5))",
    "max_retries": "use retry_policy={'max_attempts': max_retries + 1}",
    "default_retry_delay": "use retry_policy={'initial_interval': 'PT<seconds>S', "
                           "'backoff_strategy': 'none'}",
    "retry_on_worker_lost": "a lost worker already consumes one OJS attempt (RET-12)",
}


def reject_celery_retry_options(options: Mapping[str, Any]) -> None:
    """Raise ``OjsValidationError`` if ``options`` (a task class dict) sets a Celery retry option.

    The message carries the equivalent ``retry_policy`` that
    ``ojs_adapters.migrate.from_celery`` proposes, when it can propose one.
    ``retry_on_worker_lost=False`` is what OjsTask needs, so it passes.
    """
    given = {name: options[name] for name in _CELERY_RETRY_OPTIONS if name in options
             and not (name == "retry_on_worker_lost" and not options[name])}
    if not given:
        return
    name, value = next(iter(given.items()))
    instead = _CELERY_RETRY_OPTIONS[name]
    suggestion, lost = _suggested_policy(given)
    if suggestion is not None:
        instead += f"; these options translate to retry_policy={suggestion!r}"
        if lost:  # said, so the proposal is not taken for the same behaviour
            instead += f", which is not the same: {lost}"
    raise OjsValidationError(
        f"OjsTask does not combine Celery's {name}={value!r} with the OJS retry policy: "
        f"{instead}",
        code="INVALID_RETRY_POLICY",
        details={"field": name, "value": repr(value), "rule": instead,
                 "suggested_policy": suggestion},
    )


def _suggested_policy(given: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """The policy ``from_celery`` proposes for ``given`` (``None`` when it has none), and
    what it does not keep (its lossy notes; empty when it keeps everything)."""
    options = {k: ([_type_name(e) for e in v] if k.endswith("autoretry_for") else v)
               for k, v in given.items() if k != "retry_on_worker_lost"}
    if not options:
        return None, ""
    try:
        migration = from_celery(options)
    except Exception:  # a hint only: the rejection stands either way
        return None, ""
    if migration.policy is None:
        return None, ""
    lost = "; ".join(f"{n.field}: {n.text}" if n.field else n.text
                     for n in migration.notes if n.lossy)
    return migration.policy.to_dict(), lost


def _type_name(exc_type: Any) -> str:
    return exc_type if isinstance(exc_type, str) else error_type_of(exc_type)


def app_policy(app: Any) -> RetryPolicy:
    """The app-wide default policy (the OJS default merged with the app setting)."""
    return _built(setting(app, APP_DEFAULT_SETTING), None)


def task_policy(task_policy_data: Mapping[str, Any] | RetryPolicy | None, app: Any) -> RetryPolicy:
    """A task's effective policy: its ``retry_policy`` merged over the app default."""
    base = app_policy(app)
    if isinstance(task_policy_data, RetryPolicy):
        return task_policy_data
    return _built(task_policy_data, base) if task_policy_data else base


#: The last policy built per settings object (the app's default, a task's
#: ``retry_policy``), with a copy of the data it was built from and its base.
_BUILT: dict[int, tuple[Any, Any, RetryPolicy | None, RetryPolicy]] = {}


def _built(data: Any, base: RetryPolicy | None) -> RetryPolicy:
    """``RetryPolicy.from_dict(data, base=base)``, without its JSON cache key (a dump of
    ``data``) on every attempt while ``data`` stays as it was."""
    if data is None or isinstance(data, RetryPolicy):
        return RetryPolicy.from_dict(data, base=base)
    known = _BUILT.get(id(data))
    if known is not None and known[0] is data and known[2] is base and _same(known[1], data):
        return known[3]
    policy = RetryPolicy.from_dict(data, base=base)
    try:
        kept = copy.deepcopy(data)
    except Exception:  # not plain data: built again each time, as before
        return policy
    if len(_BUILT) >= 256:
        _BUILT.clear()
    _BUILT[id(data)] = (data, kept, base, policy)
    return policy


def _same(kept: Any, now: Any) -> bool:
    """Equal and of the same types all the way down: ``True`` is not ``1`` to the policy
    schema, and a live mapping (a settings proxy) is never its copy."""
    if type(kept) is not type(now):
        return False
    if isinstance(kept, dict):
        return kept.keys() == now.keys() and all(_same(v, now[k]) for k, v in kept.items())
    if isinstance(kept, (list, tuple)):
        return len(kept) == len(now) and all(map(_same, kept, now))
    return bool(kept == now)
