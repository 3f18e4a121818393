"""The OJS error catalog (ojs-errors.md section 4) as data.

Every canonical code with its category, default retryability and protocol
mappings (sections 5.1 to 5.3). Code elsewhere looks codes up here; nothing
else in the package spells out a catalog fact.

>>> ERROR_CATALOG["RATE_LIMITED"].http_status
429
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType


class ErrorCategory(str, Enum):
    """The six error categories of ojs-errors.md section 4 (4.1 to 4.6)."""

    VALIDATION = "validation"
    CONFLICT = "conflict"
    AUTH = "auth"
    RESOURCE = "resource"
    EXECUTION = "execution"
    BACKEND = "backend"


#: Categories whose errors are never retried, whatever they claim (ERR-015).
NEVER_RETRYABLE: frozenset[ErrorCategory] = frozenset(
    {ErrorCategory.VALIDATION, ErrorCategory.CONFLICT, ErrorCategory.AUTH}
)


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    """One canonical error code and what the spec says about it.

    ``retryable`` is the default retryability; ``None`` means "per retry
    policy" (the execution codes HANDLER_ERROR, HANDLER_TIMEOUT, HANDLER_PANIC).
    """

    code: str
    category: ErrorCategory
    description: str
    retryable: bool | None
    http_status: int | None = None
    grpc_status: str | None = None
    grpc_code: int | None = None
    amqp: str | None = None


_V, _C, _A = ErrorCategory.VALIDATION, ErrorCategory.CONFLICT, ErrorCategory.AUTH
_R, _E, _B = ErrorCategory.RESOURCE, ErrorCategory.EXECUTION, ErrorCategory.BACKEND

# (code, category, retryable, http, grpc name, grpc number, amqp mechanism, description)
_ROWS: tuple[tuple[str, ErrorCategory, bool | None, int | None, str | None, int | None,
                   str | None, str], ...] = (
    ("INVALID_PAYLOAD", _V, False, 400, "INVALID_ARGUMENT", 3, None,
     "Job envelope fails structural validation"),
    ("INVALID_JOB_TYPE", _V, False, 400, "INVALID_ARGUMENT", 3, None,
     "Job type is not registered or does not match the allowlist"),
    ("INVALID_QUEUE", _V, False, 400, None, None, None,
     "Queue name is invalid or does not exist"),
    ("INVALID_ARGS", _V, False, 400, "INVALID_ARGUMENT", 3, None,
     "Job args fail type checking or schema validation"),
    ("INVALID_METADATA", _V, False, 400, None, None, None,
     "Meta field is malformed or exceeds size limit (64 KB)"),
    ("INVALID_STATE_TRANSITION", _V, False, 409, "FAILED_PRECONDITION", 9, None,
     "Attempted an invalid lifecycle state change"),
    ("INVALID_RETRY_POLICY", _V, False, 400, None, None, None,
     "Retry policy fails validation"),
    ("INVALID_CRON_EXPRESSION", _V, False, 400, None, None, None,
     "Cron expression cannot be parsed"),
    ("SCHEMA_VALIDATION_FAILED", _V, False, 422, "INVALID_ARGUMENT", 3, None,
     "Job args don't conform to the registered schema for this job type+version"),
    ("DUPLICATE_JOB", _C, False, 409, "ALREADY_EXISTS", 6, None,
     "Unique job constraint violated"),
    ("JOB_ALREADY_COMPLETED", _C, False, 409, "FAILED_PRECONDITION", 9, None,
     "Operation attempted on a terminal job"),
    ("JOB_ALREADY_CANCELLED", _C, False, 409, None, None, None,
     "Operation attempted on a cancelled job"),
    ("UNAUTHENTICATED", _A, False, 401, "UNAUTHENTICATED", 16, None,
     "No credentials provided or credentials invalid"),
    ("PERMISSION_DENIED", _A, False, 403, "PERMISSION_DENIED", 7, None,
     "Authenticated but lacks required permission"),
    ("TOKEN_EXPIRED", _A, False, 401, None, None, None,
     "Authentication token has expired"),
    ("TENANT_ACCESS_DENIED", _A, False, 403, None, None, None,
     "Operation on a tenant the caller doesn't have access to"),
    ("NOT_FOUND", _R, False, 404, "NOT_FOUND", 5, None,
     "Requested job, queue, or resource does not exist"),
    ("QUEUE_PAUSED", _R, True, 422, "FAILED_PRECONDITION", 9, None,
     "Target queue is paused and not accepting jobs"),
    ("QUEUE_FULL", _R, True, 429, "RESOURCE_EXHAUSTED", 8,
     "Basic.Return (mandatory flag, unroutable)",
     "Queue depth has reached the configured bound"),
    ("RATE_LIMITED", _R, True, 429, "RESOURCE_EXHAUSTED", 8,
     "Basic.Nack + requeue with delay",
     "Rate limit or concurrency limit exceeded"),
    ("PAYLOAD_TOO_LARGE", _R, False, 413, "RESOURCE_EXHAUSTED", 8, None,
     "Job envelope exceeds backend max payload size"),
    ("METADATA_TOO_LARGE", _R, False, 413, None, None, None,
     "Meta field exceeds 64 KB limit"),
    ("QUEUE_NAME_TOO_LONG", _R, False, None, None, None, None,
     "Queue name exceeds 255 bytes"),
    ("JOB_TYPE_TOO_LONG", _R, False, None, None, None, None,
     "Job type exceeds 255 bytes"),
    ("CHECKSUM_MISMATCH", _R, False, None, None, None, None,
     "External payload reference checksum failed"),
    ("UNSUPPORTED_FEATURE", _R, False, 422, "UNIMPLEMENTED", 12, None,
     "Feature requires a conformance level the backend doesn't support"),
    ("UNSUPPORTED_COMPRESSION", _R, False, None, None, None, None,
     "Unsupported compression codec"),
    ("HANDLER_ERROR", _E, None, None, None, None,
     "Basic.Nack + republish to retry exchange",
     "Job handler threw an exception during execution"),
    ("HANDLER_TIMEOUT", _E, None, None, "DEADLINE_EXCEEDED", 4,
     "Basic.Nack + republish with backoff TTL",
     "Job handler exceeded the configured execution timeout"),
    ("HANDLER_PANIC", _E, None, None, None, None, None,
     "Job handler caused an unrecoverable error (panic, segfault)"),
    ("NON_RETRYABLE_ERROR", _E, False, None, None, None, "Basic.Nack + route to DLX",
     "Error type matched non_retryable_errors in retry policy"),
    ("JOB_CANCELLED", _E, False, None, "CANCELLED", 1, None,
     "Job was cancelled while executing"),
    ("BACKEND_ERROR", _B, True, 500, "INTERNAL", 13, None,
     "Internal backend storage or transport failure"),
    ("BACKEND_UNAVAILABLE", _B, True, 503, "UNAVAILABLE", 14, None,
     "Backend is unreachable"),
    ("REPLICATION_LAG", _B, True, None, None, None, None,
     "Operation failed due to replication consistency issue"),
    ("BACKEND_TIMEOUT", _B, True, 504, None, None, None,
     "Backend operation timed out"),
)

#: Every canonical code (ojs-errors.md section 4), read-only.
ERROR_CATALOG: Mapping[str, CatalogEntry] = MappingProxyType(
    {
        code: CatalogEntry(code, cat, desc, retryable, http, grpc, grpc_n, amqp)
        for code, cat, retryable, http, grpc, grpc_n, amqp, desc in _ROWS
    }
)

#: Handler response codes (ojs-retry.md section 7.1; ojs-errors.md section 4.7).
HANDLER_CODES: frozenset[str] = frozenset({"RETRY", "DISCARD", "DEAD_LETTER", "FAIL"})

#: Custom code shape (ojs-errors.md section 8.1): NAMESPACE (2-30 A-Z0-9) "_" CODE.
_CUSTOM_CODE = re.compile(r"^[A-Z0-9]{2,30}_[A-Z0-9]+(?:_[A-Z0-9]+)*$")


def custom_code_problem(code: str) -> str | None:
    """Say why ``code`` is not a valid custom error code (ERR-013), or ``None``.

    >>> custom_code_problem("ACME_CREDIT_CHECK_FAILED") is None
    True
    >>> custom_code_problem("OJS_NEW_THING")
    "the 'OJS_' prefix is reserved for canonical codes"
    """
    if code in ERROR_CATALOG:
        return None
    if code.startswith("OJS_"):
        return "the 'OJS_' prefix is reserved for canonical codes"
    if not _CUSTOM_CODE.match(code):
        return "must be NAMESPACE_CODE in SCREAMING_SNAKE_CASE, namespace 2-30 of A-Z0-9"
    for canonical in ERROR_CATALOG:
        if code.startswith(canonical + "_"):
            return f"must not use the canonical code {canonical!r} as a prefix"
    return None
