"""The OJS RetryPolicy value (ojs-retry.md sections 2, 8, 11 and 14).

A ``RetryPolicy`` is immutable, hashable and always valid: the only ways to
make one are the constructor's defaults, ``from_dict`` and ``from_json``, and
both validate against the shipped JSON Schema plus the rules a schema cannot
say (RET-16, RET-19, RET-20). Partial policies merge with the defaults (RET-10).

>>> policy = RetryPolicy.from_dict({"max_attempts": 5, "initial_interval": "PT0.5S"})
>>> policy.schedule()
[0.5, 1.0, 2.0, 4.0]
>>> policy.delay(1, jitter_sample=0.0)  # multiplier 0.5
0.25
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from functools import lru_cache
from typing import Any, Literal, TypedDict

from ojs_adapters import backoff
from ojs_adapters.durations import format_duration, parse_duration
from ojs_adapters.errors import OjsValidationError, invalid_policy
from ojs_adapters.schema import first_schema_problem

#: What happens when attempts run out or a non-retryable error is seen (section 2.2).
OnExhaustion = Literal["discard", "dead_letter"]

#: The default policy of section 8, as a mapping.
DEFAULT_POLICY: Mapping[str, Any] = {
    "max_attempts": 3,
    "initial_interval": "PT1S",
    "backoff_coefficient": 2.0,
    "max_interval": "PT5M",
    "jitter": True,
    "non_retryable_errors": [],
    "on_exhaustion": "discard",
    "backoff_strategy": "exponential",
}

#: Defaults of the opt-in extension fields; absent from ``DEFAULT_POLICY``, which is the spec's.
EXTENSION_DEFAULTS: Mapping[str, Any] = {"jitter_mode": "ojs", "max_duration": None}


class RetryPolicyDict(TypedDict, total=False):
    """A (partial) retry policy as a mapping: the keys ``retry_policy=`` arguments accept.

    Every key is optional (RET-10: the rest comes from the layer below). Durations are
    ISO 8601 strings (RET-02). A type for editors and mypy: a misspelt key
    (``max_attemps``) is flagged where a parameter is typed with it; at run time
    ``RetryPolicy.from_dict`` still validates whatever it is given (RET-16).

    >>> policy: RetryPolicyDict = {"max_attempts": 5, "on_exhaustion": "dead_letter"}
    >>> RetryPolicy.from_dict(policy).max_attempts
    5
    """

    max_attempts: int
    initial_interval: str
    backoff_coefficient: float
    max_interval: str
    jitter: bool
    non_retryable_errors: Sequence[str]
    on_exhaustion: OnExhaustion
    backoff_strategy: backoff.BackoffStrategy
    #: Opt-in extension, not in OJS: "ojs" (default), "full" or "decorrelated" jitter.
    jitter_mode: backoff.JitterMode
    #: Extension (integration standard R-3): ISO 8601 duration, or ``None`` for no limit.
    max_duration: str | None


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a failing job is retried: attempts, backoff, jitter, non-retryable errors.

    ``RetryPolicy()`` is the default policy (RET-09). Build others with
    ``RetryPolicy.from_dict``, which validates and merges with the defaults.
    """

    max_attempts: int = 3
    initial_interval: timedelta = timedelta(seconds=1)
    backoff_coefficient: float = 2.0
    max_interval: timedelta = timedelta(minutes=5)
    jitter: bool = True
    non_retryable_errors: tuple[str, ...] = ()
    on_exhaustion: OnExhaustion = "discard"
    backoff_strategy: backoff.BackoffStrategy = "exponential"
    #: Opt-in extension, not in OJS: "ojs" (default), "full" or "decorrelated" jitter.
    jitter_mode: backoff.JitterMode = "ojs"
    #: Extension (integration standard R-3): no retry starts after first attempt + this.
    max_duration: timedelta | None = None
    # Derived once, for speed on the decision path.
    _initial_s: float = field(init=False, repr=False, compare=False, hash=False)
    _max_s: float = field(init=False, repr=False, compare=False, hash=False)
    _exact: frozenset[str] = field(init=False, repr=False, compare=False, hash=False)
    _prefixes: tuple[str, ...] = field(init=False, repr=False, compare=False, hash=False)
    _matches: dict[tuple[str, ...], str | None] = field(
        init=False, repr=False, compare=False, hash=False)
    _dict: dict[str, Any] | None = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        setter = object.__setattr__
        setter(self, "_initial_s", self.initial_interval.total_seconds())
        setter(self, "_max_s", self.max_interval.total_seconds())
        setter(self, "_exact", frozenset(e for e in self.non_retryable_errors
                                         if not e.endswith(".*")))
        # "auth.*" keeps "auth." so that "auth" itself does not match (section 6.2).
        setter(self, "_prefixes", tuple(e[:-1] for e in self.non_retryable_errors
                                        if e.endswith(".*")))
        setter(self, "_matches", {})  # memo of matching_entry, bounded below
        setter(self, "_dict", None)  # memo of to_dict (every attempt's record holds it)

    # -- construction -----------------------------------------------------------------

    @classmethod
    def from_dict(
        cls, data: RetryPolicyDict | Mapping[str, Any] | RetryPolicy | None, *,
        base: RetryPolicy | None = None,
    ) -> RetryPolicy:
        """Validate a (partial) policy mapping and merge it over ``base`` or the defaults.

        ``data`` is typed ``RetryPolicyDict`` for editors; any mapping is accepted (a
        parsed JSON or YAML document), and checked here.

        Raises ``OjsValidationError`` (code ``INVALID_RETRY_POLICY``) whose
        ``details`` name the ``field``, the ``value`` and the ``rule``.
        """
        if isinstance(data, RetryPolicy):
            return data
        if data is None:
            return base or _DEFAULT
        if not isinstance(data, Mapping):
            raise invalid_policy("<policy>", data, "a retry policy must be a JSON object")
        try:
            # JSON text as the cache key: it tells True from 1 and is hashable.
            key = json.dumps(data, sort_keys=True)
        except (TypeError, ValueError):
            return _build(data, base)  # not JSON data: the schema check names the field
        return _cached_build(key, base)

    @classmethod
    def from_json(cls, text: str | bytes, *, base: RetryPolicy | None = None) -> RetryPolicy:
        """Parse a JSON document and validate it as with ``from_dict``."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise invalid_policy("<policy>", str(exc), "must be valid JSON") from None
        return cls.from_dict(data, base=base)

    def to_dict(self) -> dict[str, Any]:
        """The full effective policy, durations as ISO 8601 strings.

        The opt-in extensions (``jitter_mode``, ``max_duration``) appear only when set
        away from their defaults, so a plain OJS policy stays in the spec's shape.
        """
        memo = self._dict
        if memo is None:
            memo = self._as_dict()
            object.__setattr__(self, "_dict", memo)
        return {**memo, "non_retryable_errors": list(self.non_retryable_errors)}

    def _as_dict(self) -> dict[str, Any]:
        out = {
            "max_attempts": self.max_attempts,
            "initial_interval": format_duration(self.initial_interval),
            "backoff_coefficient": self.backoff_coefficient,
            "max_interval": format_duration(self.max_interval),
            "jitter": self.jitter,
            "non_retryable_errors": list(self.non_retryable_errors),
            "on_exhaustion": self.on_exhaustion,
            "backoff_strategy": self.backoff_strategy,
        }
        if self.jitter_mode != "ojs":
            out["jitter_mode"] = self.jitter_mode
        if self.max_duration is not None:
            out["max_duration"] = format_duration(self.max_duration)
        return out

    # -- behaviour ----------------------------------------------------------------------

    @property
    def max_retries(self) -> int:
        """Retries the policy allows: ``max_attempts - 1``, never below zero."""
        return max(self.max_attempts - 1, 0)

    def capped_delay(self, retry: int) -> float:
        """The jitter-free delay in seconds for retry ``retry`` (raw, then capped)."""
        _check_retry(retry)
        return self._capped(retry)

    def _capped(self, retry: int) -> float:
        # Positional call: keyword calls cost measurably on the decision path.
        raw = backoff.raw_delay(self.backoff_strategy, retry, self._initial_s,
                                self.backoff_coefficient)
        return raw if raw < self._max_s else self._max_s

    def _jittered(self, retry: int, sample: float | None,
                  previous: float | None = None) -> float:
        """Delay for a checked retry number and sample: the decision engine's fast path."""
        if sample is None or not self.jitter:
            return self._capped(retry)
        mode = self.jitter_mode
        if mode == "ojs":
            return backoff.final_delay(self._capped(retry), self._max_s, sample)
        if mode == "full":
            return backoff.full_jitter(self._capped(retry), sample)
        return backoff.decorrelated_jitter(self._initial_s, previous, self._max_s, sample)

    def delay(self, retry: int, *, jitter_sample: float | None = None,
              previous: float | None = None) -> float:
        """Seconds to wait before retry ``retry`` (1-indexed; retry 1 is attempt 2).

        With jitter on, ``jitter_sample`` u in [0, 1) gives the multiplier
        0.5 + u (RET-05); ``None`` draws one. Capped before and after jitter
        (RET-04, RET-06). With jitter off the sample is ignored. ``previous`` is the
        last delay, read only by ``jitter_mode: decorrelated``.
        """
        _check_retry(retry)
        if not self.jitter:
            return self._capped(retry)
        if jitter_sample is None:
            jitter_sample = random.random()
        else:
            check_jitter_sample(jitter_sample)
        return self._jittered(retry, jitter_sample, previous)

    def jitter_bounds(self, retry: int) -> tuple[float, float]:
        """The lowest and highest delay jitter can give for ``retry`` (section 5.2)."""
        capped = self.capped_delay(retry)
        if not self.jitter:
            return capped, capped
        if self.jitter_mode == "full":
            return 0.0, capped
        if self.jitter_mode == "decorrelated":
            return self._initial_s, self._max_s
        return capped * backoff.JITTER_LOW, min(capped * backoff.JITTER_HIGH, self._max_s)

    def schedule(self, *, limit: int | None = None) -> list[float]:
        """The jitter-free delays for every retry the policy allows (at most ``limit``)."""
        count = self.max_retries if limit is None else min(self.max_retries, limit)
        return [self.capped_delay(n) for n in range(1, count + 1)]

    def matches_non_retryable(self, error_type: str) -> bool:
        """Whether ``error_type`` matches an entry exactly or by ``prefix.*`` (section 6.2)."""
        return self.matching_entry((error_type,)) is not None

    def matching_entry(self, error_types: Iterable[str]) -> str | None:
        """The first ``non_retryable_errors`` entry any of ``error_types`` matches, if any."""
        exact, prefixes = self._exact, self._prefixes
        if not exact and not prefixes:
            return None
        names = tuple(error_types)
        memo = self._matches
        try:
            return memo[names]
        except KeyError:
            pass
        found = self._first_match(names)
        if len(memo) < 1024:
            memo[names] = found
        return found

    def _first_match(self, names: tuple[str, ...]) -> str | None:
        exact, prefixes = self._exact, self._prefixes
        for name in names:
            if name in exact:
                return name
            for prefix in prefixes:
                if name.startswith(prefix):
                    return prefix + "*"
        return None


_DEFAULT = RetryPolicy()


def check_jitter_sample(sample: float) -> None:
    """Raise ``OjsValidationError`` unless ``sample`` is a float in [0, 1)."""
    if isinstance(sample, bool) or not isinstance(sample, (int, float)) \
            or not 0.0 <= sample < 1.0:
        raise OjsValidationError(
            f"jitter_sample must be in [0, 1), got {sample!r}",
            code="INVALID_ARGS",
            details={"field": "jitter_sample", "value": repr(sample), "rule": "0 <= u < 1"},
        )


def _check_retry(retry: int) -> None:
    if type(retry) is not int or retry < 1:
        raise OjsValidationError(
            f"retry number must be an integer >= 1 (retry 1 is attempt 2), got {retry!r}",
            code="INVALID_ARGS",
            details={"field": "retry", "value": repr(retry), "rule": "integer >= 1"},
        )


@lru_cache(maxsize=1024)
def _cached_build(key: str, base: RetryPolicy | None) -> RetryPolicy:
    return _build(json.loads(key), base)


def _build(data: Mapping[str, Any], base: RetryPolicy | None) -> RetryPolicy:
    problem = first_schema_problem(data)
    if problem is not None:
        raise invalid_policy(*problem)
    merged = dict(EXTENSION_DEFAULTS)
    merged.update(DEFAULT_POLICY if base is None else base.to_dict())
    merged.update(data)
    coefficient = merged["backoff_coefficient"]
    if not math.isfinite(coefficient):
        raise invalid_policy("backoff_coefficient", coefficient, "must be a finite number >= 1.0")
    initial = parse_duration(merged["initial_interval"], field="initial_interval")
    maximum = parse_duration(merged["max_interval"], field="max_interval")
    if initial <= timedelta(0):
        raise invalid_policy("initial_interval", merged["initial_interval"],
                             "must be greater than zero")
    if maximum < initial:
        raise invalid_policy("max_interval", merged["max_interval"],
                             f"must be >= initial_interval ({merged['initial_interval']})")
    max_duration = None
    if merged["max_duration"] is not None:
        max_duration = parse_duration(merged["max_duration"], field="max_duration")
        if max_duration <= timedelta(0):
            raise invalid_policy("max_duration", merged["max_duration"],
                                 "must be greater than zero")
    return RetryPolicy(
        max_attempts=merged["max_attempts"],
        initial_interval=initial,
        backoff_coefficient=float(coefficient),
        max_interval=maximum,
        jitter=merged["jitter"],
        non_retryable_errors=tuple(merged["non_retryable_errors"]),
        on_exhaustion=merged["on_exhaustion"],
        backoff_strategy=merged["backoff_strategy"],
        jitter_mode=merged["jitter_mode"],
        max_duration=max_duration,
    )
