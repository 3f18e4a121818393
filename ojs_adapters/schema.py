"""The retry-policy JSON Schema shipped with the package (ojs-retry.md section 14; RET-20).

>>> first_schema_problem({"max_attempts": -1})
('max_attempts', -1, 'must be >= 0')
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from importlib import resources
from typing import Any, cast

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

#: File name of the schema inside ``ojs_adapters/schemas``.
SCHEMA_FILE = "retry-policy.json"

_TYPE_WORDS = {"integer": "an integer", "number": "a number", "string": "a string",
               "boolean": "a boolean", "array": "an array of strings", "object": "an object"}


@cache
def retry_policy_schema() -> dict[str, Any]:
    """The schema as a dict: the spec's, plus ``backoff_strategy``."""
    folder = resources.files("ojs_adapters").joinpath("schemas")
    text = folder.joinpath(SCHEMA_FILE).read_text("utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


@cache
def _validator() -> Draft202012Validator:
    return Draft202012Validator(retry_policy_schema())


def first_schema_problem(data: Mapping[str, Any]) -> tuple[str, Any, str] | None:
    """``(field, value, rule)`` for the first schema violation in ``data``, else ``None``."""
    errors = sorted(_validator().iter_errors(dict(data)), key=lambda e: list(e.absolute_path))
    if not errors:
        return None
    return _describe(errors[0], data)


def _describe(error: ValidationError, data: Mapping[str, Any]) -> tuple[str, Any, str]:
    path = list(error.absolute_path)
    if error.validator == "additionalProperties":
        allowed = sorted(retry_policy_schema()["properties"])
        unknown = sorted(set(data) - set(allowed))
        name = str(unknown[0]) if unknown else "<policy>"
        return name, data.get(name), f"is not a retry policy field (allowed: {', '.join(allowed)})"
    name = str(path[0]) if path else "<policy>"
    if len(path) > 1:
        name = f"{path[0]}[{path[1]}]"
    value = error.instance
    keyword, expected = error.validator, cast(Any, error.validator_value)
    if keyword == "type":
        kinds = expected if isinstance(expected, list) else [expected]
        rule = "must be " + " or ".join(_TYPE_WORDS.get(str(k), str(k)) for k in kinds)
        if isinstance(value, bool) and expected in ("integer", "number"):
            rule += " (true/false is not a number)"
    elif keyword == "minimum":
        rule = f"must be >= {expected}"
    elif keyword == "enum":
        rule = "must be one of " + ", ".join(repr(v) for v in expected)
    elif keyword == "pattern":
        rule = "is not an ISO 8601 duration (PnDTnHnMnS, e.g. 'PT1S', 'PT0.5S', 'PT5M')"
    elif keyword == "minLength":
        rule = "must be a non-empty string"
    else:  # pragma: no cover - every keyword in the schema is handled above
        rule = error.message
    return name, value, rule
