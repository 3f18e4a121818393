"""What both adapters share at run time (DESIGN.md "Layers"): imports the core only.

The delivery lifecycle (``admission``, ``delivery``), leases and claims, the hand-off,
parking, budgets, backend retry, instrumentation and dead-letter management. The names
here are the ones applications use: decision hooks and logs, and retry budgets.
"""

from ojs_adapters.runtime.budget import LocalRetryBudget, RedisRetryBudget, RetryBudgets
from ojs_adapters.runtime.events import DecisionEvent, add_hook, remove_hook
from ojs_adapters.runtime.logs import LogDecisions

__all__ = [
    "DecisionEvent",
    "LocalRetryBudget",
    "LogDecisions",
    "RedisRetryBudget",
    "RetryBudgets",
    "add_hook",
    "remove_hook",
]
