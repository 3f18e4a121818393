"""Retry budgets (integration standard R-7): at most a share of executions may be retries.

A budget belongs to one dependency (a name tasks declare). Every execution of a
job that uses it is recorded; ``allow_retry`` grants a retry only while retries
in the rolling window stay within ``share`` of executions (plus a small
``minimum`` so that a quiet dependency can still retry at all). ``decide`` asks
the budget before it schedules a retry and exhausts the job when refused.

``LocalRetryBudget`` counts in this process; ``RedisRetryBudget`` shares the
count between every worker through Redis, one atomic round trip per call (a Lua
script over per-second buckets). The Redis client is passed in, so the core
never imports a client library.

>>> budget = LocalRetryBudget("payments-api", share=0.2, minimum=0)
>>> for _ in range(10):
...     budget.record_execution()
>>> [budget.allow_retry() for _ in range(3)]
[True, True, False]
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from collections import deque
from collections.abc import Mapping
from typing import Any

from ojs_adapters.errors import OjsValidationError
from ojs_adapters.runtime._instant import RECORDERS_REGISTRY, block_state

#: Length of the rolling window, in seconds (R-7).
WINDOW_SECONDS = 30
#: Default share of executions that may be retries (R-7).
DEFAULT_SHARE = 0.2
#: Retries always allowed per window, however quiet the dependency.
DEFAULT_MINIMUM = 3


def _allowed(executions: int, retries: int, share: float, minimum: int) -> bool:
    return retries < max(math.floor(executions * share), minimum)


def _check_share(share: float) -> float:
    """``share`` if it is a fraction of executions (within [0, 1]); else ``OjsValidationError``."""
    if not 0.0 <= share <= 1.0:
        raise OjsValidationError(f"share must be within [0, 1], got {share!r}",
                                 code="INVALID_ARGS",
                                 details={"field": "share", "value": repr(share),
                                          "rule": "0 <= share <= 1"})
    return share


class LocalRetryBudget:
    """An in-process retry budget; the fallback when no Redis is shared.

    >>> LocalRetryBudget("payments-api", share=1.5)
    Traceback (most recent call last):
    ...
    ojs_adapters.errors.OjsValidationError: share must be within [0, 1], got 1.5
    """

    def __init__(self, dependency: str, *, share: float = DEFAULT_SHARE,
                 minimum: int = DEFAULT_MINIMUM, window: float = WINDOW_SECONDS) -> None:
        _check_share(share)
        self.dependency, self.share, self.minimum, self.window = dependency, share, minimum, window
        self._executions: deque[float] = deque()
        self._retries: deque[float] = deque()
        self._lock = threading.Lock()

    def _trim(self, now: float) -> None:
        for times in (self._executions, self._retries):
            while times and times[0] <= now - self.window:
                times.popleft()

    def record_execution(self) -> None:
        """Count one execution (every attempt, first or retry)."""
        now = time.monotonic()
        with self._lock:
            self._trim(now)
            self._executions.append(now)

    def allow_retry(self) -> bool:
        """Take a retry from the budget if one is left."""
        now = time.monotonic()
        with self._lock:
            self._trim(now)
            if not _allowed(len(self._executions), len(self._retries), self.share,
                            self.minimum):
                return False
            self._retries.append(now)
            return True

    def utilization(self) -> float:
        """Retries in the window over the retries allowed (1.0 = spent)."""
        with self._lock:
            self._trim(time.monotonic())
            cap = max(math.floor(len(self._executions) * self.share), self.minimum)
            return len(self._retries) / cap if cap else 1.0


# KEYS[1] executions prefix, KEYS[2] retries prefix; ARGV: now second, window, op,
# share, minimum. op "exec" counts an execution; op "retry" grants or refuses one;
# op "peek" returns both counts. Buckets are one key per second, expiring after the window.
_SCRIPT = """
local now, window = tonumber(ARGV[1]), tonumber(ARGV[2])
local op, share, minimum = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
if op == 'exec' then
  local key = KEYS[1] .. now
  redis.call('INCR', key)
  redis.call('EXPIRE', key, window + 1)
  return 1
end
local execs, retries = 0, 0
for s = now - window + 1, now do
  execs = execs + (tonumber(redis.call('GET', KEYS[1] .. s)) or 0)
  retries = retries + (tonumber(redis.call('GET', KEYS[2] .. s)) or 0)
end
if op == 'peek' then return {execs, retries} end
if retries < math.max(math.floor(execs * share), minimum) then
  local key = KEYS[2] .. now
  redis.call('INCR', key)
  redis.call('EXPIRE', key, window + 1)
  return 1
end
return 0
"""


class RedisRetryBudget:
    """A retry budget shared by every worker through Redis (``client``: a redis-py client).

    Falls back to a ``LocalRetryBudget`` while Redis cannot be reached, so a broker
    outage never stops retries altogether.
    """

    def __init__(self, client: Any, dependency: str, *, share: float = DEFAULT_SHARE,
                 minimum: int = DEFAULT_MINIMUM, window: int = WINDOW_SECONDS,
                 prefix: str = "ojs:budget") -> None:
        self.client, self.dependency = client, dependency
        self.share, self.minimum, self.window = share, minimum, int(window)
        self._keys = [f"{prefix}:{dependency}:e:", f"{prefix}:{dependency}:r:"]
        self.fallback = LocalRetryBudget(dependency, share=share, minimum=minimum,
                                         window=window)

    def _call(self, op: str) -> Any:
        return self.client.eval(_SCRIPT, 2, *self._keys, int(time.time()), self.window, op,
                                self.share, self.minimum)

    def record_execution(self) -> None:
        """Count one execution in the shared window."""
        try:
            self._call("exec")
        except Exception:  # Redis down: count locally rather than fail the job
            self.fallback.record_execution()

    def allow_retry(self) -> bool:
        """Take a retry from the shared budget if one is left (atomic, one round trip)."""
        try:
            return bool(self._call("retry"))
        except Exception:
            return self.fallback.allow_retry()

    def utilization(self) -> float:
        """Retries in the shared window over the retries allowed."""
        try:
            execs, retries = (int(v) for v in self._call("peek"))
        except Exception:
            return self.fallback.utilization()
        cap = max(math.floor(execs * self.share), self.minimum)
        return retries / cap if cap else 1.0


#: What ``RetryBudgets.get`` hands out.
AnyRetryBudget = LocalRetryBudget | RedisRetryBudget

#: Every ``RetryBudgets`` made in this process, for the utilization gauge (``metrics``).
BUDGETS_REGISTRY: weakref.WeakSet[RetryBudgets] = weakref.WeakSet()


def check_dependency(value: Any, field: str = "retry_budget") -> str:
    """``value`` if it names a dependency (a str of 1..128 printable characters)."""
    if type(value) is str and 0 < len(value) <= 128 and value.isprintable():
        return value
    raise OjsValidationError(
        f"{field} must name a dependency (a string of 1..128 printable characters), "
        f"got {repr(value)[:80]}", code="INVALID_ARGS",
        details={"field": field, "value": repr(value)[:80],
                 "rule": "string of 1..128 printable characters"})


class RetryBudgets:
    """One retry budget per dependency, made on first use (R-7: "tracked per dependency").

    ``client`` (a redis-py client) shares every budget between all workers through
    Redis; without one they are per process. ``overrides`` maps a dependency to its
    own ``share``/``minimum``. Adapters use this when a task or actor names its
    dependency with ``retry_budget="payments-api"``.

    >>> budgets = RetryBudgets(share=0.5, minimum=0)
    >>> budgets.get("search") is budgets.get("search")
    True
    >>> budgets.get("search").share
    0.5
    """

    def __init__(self, client: Any = None, *, share: float = DEFAULT_SHARE,
                 minimum: int = DEFAULT_MINIMUM, window: int = WINDOW_SECONDS,
                 overrides: Mapping[str, Mapping[str, Any]] | None = None,
                 prefix: str = "ojs:budget") -> None:
        _check_share(share)
        self.client, self.share, self.minimum, self.window = client, share, minimum, window
        self.overrides = {check_dependency(k, "overrides"): dict(v)
                          for k, v in (overrides or {}).items()}
        self.prefix = prefix
        self._budgets: dict[str, AnyRetryBudget] = {}
        self._lock = threading.Lock()
        self._in_block = False
        BUDGETS_REGISTRY.add(self)

    def _for_block(self) -> RetryBudgets:
        """The same budgets, counted in memory for one ``instant_retries()`` block."""
        copy = RetryBudgets(share=self.share, minimum=self.minimum, window=self.window,
                            overrides=self.overrides, prefix=self.prefix)
        copy._in_block = True
        BUDGETS_REGISTRY.discard(copy)  # not the workers' budgets: no gauge of its own
        return copy

    def get(self, dependency: str) -> AnyRetryBudget:
        """The budget of ``dependency`` (the same object on every call). Inside
        ``instant_retries()`` a block's own, in memory: no test counts another's retries
        (nor writes them to a shared Redis)."""
        if RECORDERS_REGISTRY and not self._in_block:
            return block_state(("retry-budgets", self), self._for_block).get(dependency)
        budget = self._budgets.get(dependency)
        if budget is None:
            with self._lock:
                budget = self._budgets.get(dependency)
                if budget is None:
                    budget = self._budgets[dependency] = self._make(dependency)
        return budget

    def _make(self, dependency: str) -> AnyRetryBudget:
        settings = {"share": self.share, "minimum": self.minimum, **self.overrides.get(
            dependency, {})}
        if self.client is None:
            return LocalRetryBudget(dependency, window=self.window, **settings)
        return RedisRetryBudget(self.client, dependency, window=self.window,
                                prefix=self.prefix, **settings)

    def utilizations(self) -> dict[str, float]:
        """Utilization of every budget used so far, by dependency."""
        return {name: budget.utilization() for name, budget in list(self._budgets.items())}
