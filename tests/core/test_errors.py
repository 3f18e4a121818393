"""The error catalog and typed errors (ojs-errors.md sections 3-9; ERR-001..004, 009..015)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ojs_adapters import (
    ERROR_CATALOG,
    OjsAuthError,
    OjsBackendError,
    OjsConflictError,
    OjsError,
    OjsExecutionError,
    OjsResourceError,
    OjsValidationError,
)
from ojs_adapters.catalog import ErrorCategory, custom_code_problem
from ojs_adapters.errors import error_class_for

SPEC = Path(__file__).resolve().parents[3] / "shared" / "spec" / "ojs-errors.md"

# Section 9.3, written out: code -> class (and retryable where the spec gives it).
SECTION_9_3 = {
    "INVALID_PAYLOAD": OjsValidationError, "INVALID_JOB_TYPE": OjsValidationError,
    "INVALID_QUEUE": OjsValidationError, "INVALID_ARGS": OjsValidationError,
    "INVALID_METADATA": OjsValidationError, "INVALID_STATE_TRANSITION": OjsValidationError,
    "INVALID_RETRY_POLICY": OjsValidationError, "INVALID_CRON_EXPRESSION": OjsValidationError,
    "SCHEMA_VALIDATION_FAILED": OjsValidationError, "DUPLICATE_JOB": OjsConflictError,
    "JOB_ALREADY_COMPLETED": OjsConflictError, "JOB_ALREADY_CANCELLED": OjsConflictError,
    "UNAUTHENTICATED": OjsAuthError, "PERMISSION_DENIED": OjsAuthError,
    "TOKEN_EXPIRED": OjsAuthError, "TENANT_ACCESS_DENIED": OjsAuthError,
    "NOT_FOUND": OjsResourceError, "QUEUE_PAUSED": OjsResourceError,
    "QUEUE_FULL": OjsResourceError, "RATE_LIMITED": OjsResourceError,
    "PAYLOAD_TOO_LARGE": OjsResourceError, "HANDLER_ERROR": OjsExecutionError,
    "HANDLER_TIMEOUT": OjsExecutionError, "HANDLER_PANIC": OjsExecutionError,
    "NON_RETRYABLE_ERROR": OjsExecutionError, "JOB_CANCELLED": OjsExecutionError,
    "BACKEND_ERROR": OjsBackendError, "BACKEND_UNAVAILABLE": OjsBackendError,
    "REPLICATION_LAG": OjsBackendError, "BACKEND_TIMEOUT": OjsBackendError,
}
RETRYABLE_9_3 = {"NOT_FOUND": False, "QUEUE_PAUSED": True, "QUEUE_FULL": True,
                 "RATE_LIMITED": True, "PAYLOAD_TOO_LARGE": False, "NON_RETRYABLE_ERROR": False,
                 "JOB_CANCELLED": False, "BACKEND_ERROR": True, "BACKEND_UNAVAILABLE": True,
                 "REPLICATION_LAG": True, "BACKEND_TIMEOUT": True, "HANDLER_ERROR": True}


@pytest.mark.parametrize(("code", "klass"), sorted(SECTION_9_3.items()))
def test_err009_codes_map_to_typed_exceptions(code: str, klass: type[OjsError]) -> None:
    assert error_class_for(code) is klass
    err = klass("m", code=code)
    assert isinstance(err, OjsError) and err.code == code
    if code in RETRYABLE_9_3:
        assert err.retryable is RETRYABLE_9_3[code]


def _spec_tables() -> dict[str, tuple[str, str]]:
    """code -> (section, row text) for every code row in sections 4.1 to 4.6."""
    if not SPEC.exists():
        pytest.skip(f"the spec is not beside this checkout ({SPEC})")
    rows: dict[str, tuple[str, str]] = {}
    section = ""
    for line in SPEC.read_text().splitlines():
        heading = re.match(r"^### (4\.[1-6]) ", line)
        if heading:
            section = heading.group(1)
        elif line.startswith("### ") or line.startswith("## 5"):
            section = ""
        code = re.match(r"^\| `([A-Z_]+)` \|", line)
        if section and code:
            rows[code.group(1)] = (section, line)
    return rows


def test_catalog_holds_exactly_the_codes_of_section_4() -> None:
    rows = _spec_tables()
    assert set(rows) == set(ERROR_CATALOG)
    sections = {"4.1": ErrorCategory.VALIDATION, "4.2": ErrorCategory.CONFLICT,
                "4.3": ErrorCategory.AUTH, "4.4": ErrorCategory.RESOURCE,
                "4.5": ErrorCategory.EXECUTION, "4.6": ErrorCategory.BACKEND}
    for code, (section, line) in rows.items():
        assert ERROR_CATALOG[code].category == sections[section], code
        if section == "4.4":
            assert ERROR_CATALOG[code].retryable is ("| Yes |" in line), code


def test_protocol_mappings_match_sections_5_1_and_5_2() -> None:
    if not SPEC.exists():
        pytest.skip("spec not present")
    text = SPEC.read_text()
    for code, http in re.findall(r"^\| `([A-Z_]+)` \| (\d{3}) ", text, re.M):
        assert ERROR_CATALOG[code].http_status == int(http), code
    for code, name, number in re.findall(r"^\| `([A-Z_]+)` \| ([A-Z_]+) \((\d+)\) ", text, re.M):
        assert (ERROR_CATALOG[code].grpc_status, ERROR_CATALOG[code].grpc_code) == (
            name, int(number)), code
    assert ERROR_CATALOG["HANDLER_ERROR"].amqp is not None


def test_err001_to_004_error_structure_of_section_3() -> None:
    err = OjsValidationError("Missing required field 'type' in job envelope",
                             code="INVALID_PAYLOAD", details={"field": "type"})
    assert err.to_dict() == {
        "code": "INVALID_PAYLOAD",
        "message": "Missing required field 'type' in job envelope",
        "details": {"field": "type"},
        "retryable": False,
        "doc_url": "https://openjobspec.org/errors/INVALID_PAYLOAD",
    }
    again = OjsError.from_dict(err.to_dict())
    assert type(again) is OjsValidationError and again.to_dict() == err.to_dict()


def test_err015_validation_conflict_auth_never_retryable_even_if_claimed() -> None:
    for klass, code in ((OjsValidationError, "INVALID_ARGS"), (OjsConflictError, "DUPLICATE_JOB"),
                        (OjsAuthError, "UNAUTHENTICATED")):
        assert klass("m", code=code, retryable=True).retryable is False


def test_err010_retryable_overrides_the_resource_default() -> None:
    assert OjsResourceError("m", code="NOT_FOUND", retryable=True).retryable is True
    assert OjsResourceError("m", code="RATE_LIMITED", retryable=False).retryable is False


def test_err014_unknown_codes_are_non_retryable_unless_explicitly_true() -> None:
    assert OjsError("m", code="ACME_CREDIT_CHECK_FAILED").retryable is False
    assert OjsError("m", code="ACME_CREDIT_CHECK_FAILED", retryable=True).retryable is True
    restored = OjsError.from_dict({"code": "STRIPE_CARD_DECLINED", "message": "m"})
    assert type(restored) is OjsError and restored.retryable is False
    assert restored.doc_url is None


@pytest.mark.parametrize("code", ["ACME_CREDIT_CHECK_FAILED", "STRIPE_CARD_DECLINED",
                                  "MYAPP_INSUFFICIENT_BALANCE", "A1_X"])
def test_err013_valid_custom_codes(code: str) -> None:
    assert custom_code_problem(code) is None


@pytest.mark.parametrize("code", ["OJS_NEW_THING", "acme_failed", "ACME", "A_X", "ACME__X",
                                  "ACME-FAILED", "HANDLER_ERROR_EXTRA", "",
                                  "ABCDEFGHIJKLMNOPQRSTUVWXYZABCDEFG_X"])
def test_err013_invalid_custom_codes_are_rejected(code: str) -> None:
    assert custom_code_problem(code) is not None
    with pytest.raises(ValueError, match="invalid OJS error code"):
        OjsError("m", code=code)


def test_a_typed_class_refuses_a_code_of_another_category() -> None:
    with pytest.raises(ValueError, match="OjsBackendError"):
        OjsValidationError("m", code="BACKEND_ERROR")


def test_defaults_per_class() -> None:
    assert OjsExecutionError("boom").code == "HANDLER_ERROR"
    assert OjsBackendError("down").retryable is True
    with pytest.raises(ValueError):
        OjsError("a base error needs a code")
