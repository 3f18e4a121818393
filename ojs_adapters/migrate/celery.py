"""Celery task retry options to an OJS RetryPolicy (no Celery import: options are data).

Celery counts *retries*: ``max_retries=3`` (the default) is 4 attempts, and
``max_retries=None`` retries for ever, which OJS cannot say: that case is
reported and gets no policy unless the caller names a stand-in cap with
``unbounded_attempts=``. Automatic retries happen only for ``autoretry_for``
errors, minus ``dont_autoretry_for``. With ``retry_backoff`` the countdown for
retry count r (0-based) is ``min(retry_backoff_max, factor * 2**r)`` with full
jitter (uniform in [0, countdown]) by default; without it, ``default_retry_delay``
(180 s), or ``retry_kwargs['countdown']``, every time.

>>> m = from_celery({"autoretry_for": ["Exception"], "retry_backoff": 5, "retry_jitter": False})
>>> (m.policy.max_attempts, m.policy.schedule())
(4, [5.0, 10.0, 20.0])
>>> from_celery({"max_retries": None}).policy is None
True
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ojs_adapters.migrate._common import (
    Notes,
    bad_option,
    compared,
    fixed_band,
    full_jitter_band,
    get_bool,
    get_int,
    get_names,
    get_number,
    iso_seconds,
    judged,
    normalize,
    note_ignored,
    policy_from,
    positive_interval,
)
from ojs_adapters.migrate._fidelity import Band
from ojs_adapters.migrate._model import Migration

DIALECT = "celery"
#: Celery's ``Task`` defaults.
DEFAULT_MAX_RETRIES = 3
DEFAULT_RETRY_DELAY = 180.0
DEFAULT_BACKOFF_MAX = 600
#: Names that make ``autoretry_for`` cover every error a handler can raise.
_CATCH_ALL = {"Exception", "BaseException", "builtins.Exception", "builtins.BaseException"}
#: ``retry_kwargs`` keys that change where, when or whether a retry runs.
_RETRY_KWARGS = {
    "queue": "sends each retry to another queue; a policy has no queue: route the task",
    "priority": "gives each retry another priority; a policy has none: set it on the task",
    "eta": "a fixed time for each retry; the policy computes the delay",
}
#: ``retry_kwargs`` keys autoretry ignores (``throw``) or cannot take (``exc``: it passes
#: the error itself, so Celery raises TypeError for a second one).
_RETRY_KWARGS_INERT = {"throw"}
_KNOWN = {"max_retries", "default_retry_delay", "autoretry_for", "dont_autoretry_for",
          "retry_backoff", "retry_backoff_max", "retry_jitter", "retry_kwargs"}


def from_celery(options: Mapping[str, Any] | None, *, unbounded_attempts: int | None = None,
                name: str | None = None, origin: str | None = None) -> Migration:
    """Translate the retry options of one Celery task (as given to ``@app.task``).

    ``unbounded_attempts`` is the cap to use when ``max_retries`` is ``None``;
    without it such a task gets no policy and an ``unsupported`` note.
    """
    opts = normalize(options, DIALECT)
    notes = Notes()
    note_ignored(opts, _KNOWN, notes)
    kwargs = opts.get("retry_kwargs") or {}
    if not isinstance(kwargs, Mapping):
        raise bad_option(DIALECT, "retry_kwargs", kwargs, "must be a mapping")
    kwargs = dict(kwargs)
    if kwargs and not get_names(opts, "autoretry_for", DIALECT):
        notes.add("info", "retry_kwargs", "used only by autoretry_for, which is not set: "
                  "self.retry() takes max_retries and default_retry_delay")
        kwargs = {}
    _note_retry_kwargs(kwargs, notes)
    source, key = (kwargs, "retry_kwargs.max_retries") if "max_retries" in kwargs \
        else (opts, "max_retries")
    unbounded = "max_retries" in source and source["max_retries"] is None
    retries = None if unbounded else get_int(source, "max_retries", DIALECT,
                                             default=DEFAULT_MAX_RETRIES, minimum=0)
    if retries is None:
        if unbounded_attempts is None:
            notes.add("unsupported", key, "None: Celery retries for ever; OJS max_attempts is "
                      "an exact upper bound (RET-01), so no policy is proposed. Choose a cap "
                      "(unbounded_attempts=, or --cap-unbounded N) to get one")
            return Migration(DIALECT, None, tuple(notes), name=name, origin=origin, options=opts)
        retries = max(unbounded_attempts - 1, 0)
        notes.add("lossy", key, f"None: Celery retries for ever; capped at {unbounded_attempts} "
                  "attempts as asked", asked=True)

    autoretry = get_names(opts, "autoretry_for", DIALECT)
    never = get_names(opts, "dont_autoretry_for", DIALECT)
    _note_errors(autoretry, notes)
    if never:
        notes.add("info", "dont_autoretry_for", "became non_retryable_errors (a base-class name "
                  "matches subclasses, as Celery's except clause does)")

    backoff = opts.get("retry_backoff", False)
    if isinstance(backoff, bool) or backoff is None:
        factor = 1 if backoff else 0
    elif isinstance(backoff, (int, float)) and backoff >= 0:
        factor = int(max(1.0, float(backoff))) if backoff else 0
        if factor != backoff:
            notes.add("info", "retry_backoff", f"{backoff}: Celery uses int(max(1, value)) = "
                      f"{factor} s as the factor")
    else:
        raise bad_option(DIALECT, "retry_backoff", backoff, "must be true, false or seconds")
    jitter = get_bool(opts, "retry_jitter", DIALECT, default=True)
    fields: dict[str, Any] = {"max_attempts": retries + 1, "non_retryable_errors": list(never),
                              "on_exhaustion": "discard"}
    notes.add("info", None, "Celery marks an exhausted task FAILURE and keeps no dead letter: "
              "on_exhaustion 'discard'")
    if factor and autoretry:
        top = get_int(opts, "retry_backoff_max", DIALECT, default=DEFAULT_BACKOFF_MAX, minimum=0)
        assert top is not None
        old = [_backoff_band(factor, r, top, jitter) for r in range(compared(retries))]
        scale = 0.5 if jitter else 1.0  # full jitter's mean is half the countdown
        initial = positive_interval(min(factor, top) * scale, "retry_backoff_max", notes)
        fields.update(backoff_strategy="exponential", backoff_coefficient=2.0, jitter=jitter,
                      initial_interval=iso_seconds(initial),
                      max_interval=iso_seconds(max(top * scale, initial)))
        if jitter:
            notes.add("approximate", "retry_jitter",
                      "Celery's full jitter draws from [0, countdown] (mean half of it); OJS "
                      "jitter draws from [0.5, 1.5) x delay (mean the delay itself), so "
                      "initial_interval and max_interval are half of Celery's factor and "
                      "retry_backoff_max: the expected delays match and each wait falls in "
                      "[0.25, 0.75] x the countdown. The opt-in extension jitter_mode 'full' "
                      "(with Celery's own factor) draws from [0, delay) as Celery draws "
                      "from [0, countdown], in fractions of a second where Celery draws "
                      "whole seconds")
    else:
        if factor and not autoretry:
            notes.add("info", "retry_backoff", "applies only to autoretry_for; explicit "
                      "self.retry() calls use the fixed countdown")
        delay = _fixed_delay(opts, kwargs)
        old = [fixed_band(delay)] * compared(retries)
        delay = positive_interval(delay, "default_retry_delay", notes)
        fields.update(backoff_strategy="none", jitter=False,
                      initial_interval=iso_seconds(delay), max_interval=iso_seconds(delay))
    policy = policy_from(fields)
    fidelity = judged(old, policy, notes)
    return Migration(DIALECT, policy, tuple(notes), fidelity, {}, name, origin, opts)


def _backoff_band(factor: int, retries: int, top: int, jitter: bool) -> Band:
    countdown = float(min(top, factor * 2 ** min(retries, 64)))
    return full_jitter_band(countdown) if jitter else fixed_band(countdown)


def _fixed_delay(opts: dict[str, Any], kwargs: dict[str, Any]) -> float:
    if kwargs.get("countdown") is not None:
        return get_number(kwargs, "countdown", DIALECT, default=DEFAULT_RETRY_DELAY)
    return get_number(opts, "default_retry_delay", DIALECT, default=DEFAULT_RETRY_DELAY)


def _note_retry_kwargs(kwargs: dict[str, Any], notes: Notes) -> None:
    """What ``Task.retry(**retry_kwargs)`` takes besides a count and a countdown."""
    if "exc" in kwargs:
        raise bad_option(DIALECT, "retry_kwargs", kwargs, "must not hold exc: autoretry passes "
                         "the error itself, so Celery fails every retry with a TypeError")
    for key in sorted(set(kwargs) - {"max_retries", "countdown"} - _RETRY_KWARGS_INERT):
        effect = _RETRY_KWARGS.get(key, "is passed to Task.retry(), which a policy cannot say")
        notes.add("lossy", f"retry_kwargs.{key}", effect)


def _note_errors(autoretry: tuple[str, ...], notes: Notes) -> None:
    if not autoretry:
        notes.add("lossy", "autoretry_for",
                  "empty: Celery retries only where the task calls self.retry(), and any other "
                  "error fails it at once; the policy retries every failure. Keep the "
                  "self.retry() calls (an OjsTask honours them) and list the errors that must "
                  "not retry in non_retryable_errors; if the task never calls self.retry(), use "
                  "max_attempts 1")
    elif not _CATCH_ALL & set(autoretry):
        notes.add("lossy", "autoretry_for",
                  f"Celery retries only {', '.join(autoretry)}; OJS retries every error not in "
                  "non_retryable_errors (it has no allow-list). List the errors that must not "
                  "retry, or raise JobError(type, code='FAIL') for them")
