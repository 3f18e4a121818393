"""ojs-adapters: the Open Job Spec retry policy and error catalog for Celery and Dramatiq.

The spec core: pure values and functions, no I/O, threads or broker imports. Every
retry, discard and dead-letter choice is made by ``decide``; the shared runtime
(``ojs_adapters.runtime``) and the ``celery_ext`` and ``dramatiq_ext`` adapters only
carry it out.

>>> from ojs_adapters import RetryPolicy, decide
>>> policy = RetryPolicy.from_dict({"max_attempts": 2, "on_exhaustion": "dead_letter"})
>>> decide(policy, 2, RuntimeError("down")).action
'dead_letter'
"""

from ojs_adapters.catalog import ERROR_CATALOG
from ojs_adapters.context import JobContext
from ojs_adapters.decision import Decision, decide
from ojs_adapters.errors import (
    OjsAuthError,
    OjsBackendError,
    OjsConflictError,
    OjsError,
    OjsExecutionError,
    OjsResourceError,
    OjsValidationError,
)
from ojs_adapters.failure import JobError
from ojs_adapters.history import ErrorEntry, JobRecord
from ojs_adapters.keys import check_idempotency_key, new_idempotency_key
from ojs_adapters.policy import RetryPolicy, RetryPolicyDict

__all__ = [
    "ERROR_CATALOG",
    "Decision",
    "ErrorEntry",
    "JobContext",
    "JobError",
    "JobRecord",
    "OjsAuthError",
    "OjsBackendError",
    "OjsConflictError",
    "OjsError",
    "OjsExecutionError",
    "OjsResourceError",
    "OjsValidationError",
    "RetryPolicy",
    "RetryPolicyDict",
    "check_idempotency_key",
    "decide",
    "new_idempotency_key",
]
