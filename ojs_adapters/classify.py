"""Classify what a handler caught into an OJS error type and catalog code (standard R-4, R-5).

``classify(exc)`` knows HTTP status errors (``requests``, ``httpx``,
``urllib``), gRPC status codes, connection, timeout and DNS errors, and TLS
certificate errors, which are never retried (R-9). It reads attributes and
class names, so it imports none of those libraries. ``raise_classified``
turns a classification into the ``JobError`` that ``decide`` understands.

>>> import ssl
>>> classify(ssl.SSLCertVerificationError("bad cert")).retryable
False
>>> retry_after_seconds("120")
120.0
"""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Any, NoReturn

from ojs_adapters.failure import JobError


@dataclass(frozen=True, slots=True)
class Classification:
    """An error's OJS type, catalog code and whether it may be retried."""

    type: str
    code: str
    retryable: bool
    retry_after: float | None = None
    status: int | str | None = None


# HTTP status -> (type suffix, catalog code, retryable), R-4.
_HTTP: dict[int, tuple[str, str, bool]] = {
    400: ("bad_request", "INVALID_PAYLOAD", False),
    401: ("unauthorized", "UNAUTHENTICATED", False),
    403: ("forbidden", "PERMISSION_DENIED", False),
    404: ("not_found", "NOT_FOUND", False),
    408: ("request_timeout", "BACKEND_TIMEOUT", True),
    409: ("conflict", "DUPLICATE_JOB", False),
    422: ("unprocessable_entity", "SCHEMA_VALIDATION_FAILED", False),
    429: ("too_many_requests", "RATE_LIMITED", True),
    502: ("bad_gateway", "BACKEND_UNAVAILABLE", True),
    503: ("service_unavailable", "BACKEND_UNAVAILABLE", True),
    504: ("gateway_timeout", "BACKEND_TIMEOUT", True),
}
# gRPC status name -> (catalog code, retryable), R-4 and ojs-errors.md section 5.2.
_GRPC: dict[str, tuple[str, bool]] = {
    "UNAVAILABLE": ("BACKEND_UNAVAILABLE", True),
    "DEADLINE_EXCEEDED": ("BACKEND_TIMEOUT", True),
    "RESOURCE_EXHAUSTED": ("RATE_LIMITED", True),
    "ABORTED": ("BACKEND_ERROR", True),
    "INVALID_ARGUMENT": ("INVALID_ARGS", False),
    "NOT_FOUND": ("NOT_FOUND", False),
    "PERMISSION_DENIED": ("PERMISSION_DENIED", False),
    "UNAUTHENTICATED": ("UNAUTHENTICATED", False),
    "UNIMPLEMENTED": ("UNSUPPORTED_FEATURE", False),
}


def retry_after_seconds(value: str | float | int | None, *,
                        now: datetime | None = None) -> float | None:
    """Seconds to wait from an HTTP ``Retry-After`` value: delay-seconds or an HTTP-date."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return max(float(value), 0.0)
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max((when - (now or datetime.now(timezone.utc))).total_seconds(), 0.0)


def _http_status(exc: BaseException) -> tuple[int | None, Any]:
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    if status is None:
        status = getattr(exc, "code", None) if type(exc).__name__ == "HTTPError" else None
        response = exc if status is not None else None
    headers = getattr(response, "headers", None)
    return (status if isinstance(status, int) else None), headers


def classify(exc: BaseException) -> Classification | None:
    """The OJS classification of ``exc``, or ``None`` when it is none of the known kinds."""
    if isinstance(exc, ssl.SSLCertVerificationError) or "certificate" in type(exc).__name__.lower():
        return Classification("tls.certificate_error", "HANDLER_ERROR", False)
    status, headers = _http_status(exc)
    if status is not None:
        suffix, code, retryable = _HTTP.get(
            status, ("server_error", "BACKEND_ERROR", True) if status >= 500
            else ("client_error", "INVALID_PAYLOAD", False))
        after = retry_after_seconds(headers.get("Retry-After")) if headers else None
        return Classification(f"http.{suffix}", code, retryable, after, status)
    grpc_code = getattr(exc, "code", None)
    if callable(grpc_code) and type(exc).__module__.startswith("grpc"):
        name = getattr(grpc_code(), "name", str(grpc_code()))
        code, retryable = _GRPC.get(name, ("BACKEND_ERROR", False))
        return Classification(f"grpc.{name.lower()}", code, retryable, None, name)
    if isinstance(exc, socket.gaierror):
        return Classification("network.dns_failure", "BACKEND_UNAVAILABLE", True)
    if isinstance(exc, (ConnectionRefusedError, ConnectionResetError, ConnectionAbortedError)):
        return Classification("network.connection_failed", "BACKEND_UNAVAILABLE", True)
    if isinstance(exc, TimeoutError) or "timeout" in type(exc).__name__.lower():
        return Classification("network.timeout", "BACKEND_TIMEOUT", True)
    if isinstance(exc, ConnectionError) or "connecterror" in type(exc).__name__.lower():
        return Classification("network.connection_failed", "BACKEND_UNAVAILABLE", True)
    return None


def raise_classified(exc: BaseException) -> NoReturn:
    """Re-raise ``exc`` as a ``JobError`` of its class: non-retryable ones with code ``FAIL``."""
    found = classify(exc)
    if found is None:
        raise exc
    details: dict[str, Any] = {"catalog_code": found.code}
    if found.status is not None:
        details["status"] = found.status
    raise JobError(found.type, type(exc).__name__, code=None if found.retryable else "FAIL",
                   details=details, retry_after=found.retry_after) from exc
