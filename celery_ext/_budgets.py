"""Which retry budgets an app's ``OjsTask``s draw on (R-7; ``ojs_adapters.runtime.budget``).

``app.conf.ojs_retry_budgets`` may hold a ``RetryBudgets`` (its own Redis client,
share, minimum, per-dependency overrides). Without it, budgets are shared through
the broker's Redis when the broker is Redis, else kept per worker process. A task
names its dependency with ``retry_budget="payments-api"``.
"""

from __future__ import annotations

import threading
from typing import Any

from celery_ext._conf import setting
from ojs_adapters.runtime.budget import AnyRetryBudget, RetryBudgets

#: App setting: a ``RetryBudgets`` to use instead of the default.
BUDGETS_SETTING = "ojs_retry_budgets"
_ATTRIBUTE = "_ojs_retry_budgets"
_LOCK = threading.Lock()


def budgets_of(app: Any) -> RetryBudgets:
    """The app's ``RetryBudgets`` (the setting, else a default made once per app)."""
    configured = setting(app, BUDGETS_SETTING)
    if isinstance(configured, RetryBudgets):
        return configured
    budgets: RetryBudgets | None = getattr(app, _ATTRIBUTE, None)
    if budgets is None:
        with _LOCK:
            budgets = getattr(app, _ATTRIBUTE, None)
            if budgets is None:
                budgets = RetryBudgets(_redis_client(app))
                setattr(app, _ATTRIBUTE, budgets)
    return budgets


def budget_of(app: Any, dependency: str) -> AnyRetryBudget:
    """The budget of ``dependency`` in ``app``."""
    return budgets_of(app).get(dependency)


def _redis_client(app: Any) -> Any:
    """A client of the broker's Redis, or ``None`` for any other broker."""
    url = str(app.conf.broker_url or "")
    if not url.startswith(("redis://", "rediss://")):
        return None
    import redis

    return redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
