"""Typed OJS errors (ojs-errors.md sections 3, 7, 8 and 9; ERR-009, ERR-010, ERR-013 to 015).

``OjsError`` carries a catalog ``code``, a ``message``, optional ``details`` and
a ``retryable`` property that follows section 7: validation, conflict and auth
errors are never retryable, unknown codes only when they say so explicitly.

>>> err = OjsValidationError("max_attempts must be >= 0", code="INVALID_RETRY_POLICY",
...                          details={"field": "max_attempts"})
>>> err.to_dict()["retryable"]
False
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from ojs_adapters.catalog import (
    ERROR_CATALOG,
    NEVER_RETRYABLE,
    ErrorCategory,
    custom_code_problem,
)

#: Where the spec keeps one page per canonical code.
DOC_URL = "https://openjobspec.org/errors/{code}"


class OjsError(Exception):
    """Base of every OJS error: a catalog code, a message and structured details.

    ``retryable`` given explicitly overrides the category default (section 7),
    except for validation, conflict and auth errors, which stay non-retryable.
    """

    category: ClassVar[ErrorCategory | None] = None
    #: The code used when none is given; the base class has none and needs one.
    default_code: ClassVar[str] = ""

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        details: Mapping[str, Any] | None = None,
        retryable: bool | None = None,
    ) -> None:
        code = self.default_code if code is None else code
        problem = custom_code_problem(code) if isinstance(code, str) else "must be a string"
        if problem is not None:
            raise ValueError(f"invalid OJS error code {code!r}: {problem}")
        entry = ERROR_CATALOG.get(code)
        if entry is not None and self.category is not None and entry.category != self.category:
            raise ValueError(
                f"{code} is a {entry.category.value} code, not {self.category.value}; "
                f"use {error_class_for(code).__name__}"
            )
        super().__init__(message)
        self.code: str = code
        self.message: str = message or code
        self.details: dict[str, Any] = dict(details or {})
        self._claimed_retryable = retryable

    @property
    def retryable(self) -> bool:
        """Whether an SDK may retry this error automatically (section 7, ERR-010)."""
        entry = ERROR_CATALOG.get(self.code)
        category = entry.category if entry else self.category
        if category in NEVER_RETRYABLE:
            return False
        if self._claimed_retryable is not None:
            return self._claimed_retryable
        if entry is None:
            return False  # ERR-014: unknown codes are non-retryable unless told otherwise
        return True if entry.retryable is None else entry.retryable

    @property
    def doc_url(self) -> str | None:
        """The spec's page for a canonical code; ``None`` for custom codes."""
        return DOC_URL.format(code=self.code) if self.code in ERROR_CATALOG else None

    def to_dict(self) -> dict[str, Any]:
        """The section 3 error object: code, message, details, retryable, doc_url."""
        out: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details:
            out["details"] = dict(self.details)
        out["retryable"] = self.retryable
        if self.doc_url:
            out["doc_url"] = self.doc_url
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OjsError:
        """Rebuild the typed error for a section 3 object (ERR-009 mapping)."""
        code = str(data.get("code", ""))
        klass = error_class_for(code)
        return klass(
            str(data.get("message", "")),
            code=code,
            details=data.get("details"),
            retryable=data.get("retryable"),
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, code={self.code!r})"


class OjsValidationError(OjsError):
    """Invalid input (section 4.1); never retryable."""

    category = ErrorCategory.VALIDATION
    default_code = "INVALID_PAYLOAD"


class OjsConflictError(OjsError):
    """A uniqueness or state constraint was violated (section 4.2); never retryable."""

    category = ErrorCategory.CONFLICT
    default_code = "DUPLICATE_JOB"


class OjsAuthError(OjsError):
    """Missing or insufficient credentials (section 4.3); never retryable."""

    category = ErrorCategory.AUTH
    default_code = "UNAUTHENTICATED"


class OjsResourceError(OjsError):
    """A resource or limit problem (section 4.4); retryability per code."""

    category = ErrorCategory.RESOURCE
    default_code = "NOT_FOUND"


class OjsExecutionError(OjsError):
    """A failure while running a handler (section 4.5)."""

    category = ErrorCategory.EXECUTION
    default_code = "HANDLER_ERROR"


class OjsBackendError(OjsError):
    """A broker or storage failure (section 4.6); always retryable."""

    category = ErrorCategory.BACKEND
    default_code = "BACKEND_ERROR"


_BY_CATEGORY: dict[ErrorCategory, type[OjsError]] = {
    k.category: k
    for k in (OjsValidationError, OjsConflictError, OjsAuthError, OjsResourceError,
              OjsExecutionError, OjsBackendError)
    if k.category is not None
}


def error_class_for(code: str) -> type[OjsError]:
    """The typed class for a code (section 9.3); ``OjsError`` for custom codes."""
    entry = ERROR_CATALOG.get(code)
    return _BY_CATEGORY[entry.category] if entry else OjsError


def invalid_policy(field: str, value: Any, rule: str) -> OjsValidationError:
    """The error every retry-policy validation failure raises (RET-16, RET-19, RET-20)."""
    return OjsValidationError(
        f"retry policy field {field!r}: {rule} (got {value!r})",
        code="INVALID_RETRY_POLICY",
        details={"field": field, "value": _jsonable(value), "rule": rule,
                 "error_type": "validation.retry_policy_invalid"},
    )


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)
