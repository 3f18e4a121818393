"""ojs-adapters: the Open Job Spec retry policy and error catalog for Celery and Dramatiq.

The framework-free core. Every retry, discard and dead-letter choice is made by
``decide``; the ``celery_ext`` and ``dramatiq_ext`` adapters only execute it.

>>> from ojs_adapters import RetryPolicy, decide
>>> policy = RetryPolicy.from_dict({"max_attempts": 2, "on_exhaustion": "dead_letter"})
>>> decide(policy, 2, RuntimeError("down")).action
'dead_letter'
"""

from ojs_adapters.budget import LocalRetryBudget, RedisRetryBudget, RetryBudgets
from ojs_adapters.catalog import ERROR_CATALOG, HANDLER_CODES, CatalogEntry, ErrorCategory
from ojs_adapters.classify import Classification, classify, raise_classified, retry_after_seconds
from ojs_adapters.context import JobContext
from ojs_adapters.decision import Action, Decision, RetryBudget, decide
from ojs_adapters.errors import (
    OjsAuthError,
    OjsBackendError,
    OjsConflictError,
    OjsError,
    OjsExecutionError,
    OjsResourceError,
    OjsValidationError,
    error_class_for,
)
from ojs_adapters.events import DecisionEvent, add_hook, emit, remove_hook
from ojs_adapters.failure import Failure, HandlerCode, JobError, describe_failure, error_type_of
from ojs_adapters.history import MIN_HISTORY, ErrorEntry, JobRecord
from ojs_adapters.keys import check_idempotency_key, new_idempotency_key
from ojs_adapters.logs import LogDecisions
from ojs_adapters.policy import DEFAULT_POLICY, RetryPolicy, RetryPolicyDict

__all__ = [
    "DEFAULT_POLICY",
    "ERROR_CATALOG",
    "HANDLER_CODES",
    "MIN_HISTORY",
    "Action",
    "CatalogEntry",
    "Classification",
    "Decision",
    "DecisionEvent",
    "ErrorCategory",
    "ErrorEntry",
    "Failure",
    "HandlerCode",
    "JobContext",
    "JobError",
    "JobRecord",
    "LocalRetryBudget",
    "LogDecisions",
    "OjsAuthError",
    "OjsBackendError",
    "OjsConflictError",
    "OjsError",
    "OjsExecutionError",
    "OjsResourceError",
    "OjsValidationError",
    "RedisRetryBudget",
    "RetryBudget",
    "RetryBudgets",
    "RetryPolicy",
    "RetryPolicyDict",
    "add_hook",
    "check_idempotency_key",
    "classify",
    "decide",
    "describe_failure",
    "emit",
    "error_class_for",
    "error_type_of",
    "new_idempotency_key",
    "raise_classified",
    "remove_hook",
    "retry_after_seconds",
]
