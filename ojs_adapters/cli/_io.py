"""Input, output and error reporting shared by the ``ojs-retry`` verbs.

Every verb reads JSON or YAML from a path or ``-`` (stdin), prints a rich table
or, with ``--json``, one JSON document, and reports bad input as the OJS error
(code, field, rule) with exit status 1, never a traceback.

>>> human_seconds(5400.0)
'1h 30m'
>>> human_seconds(0.25)
'250ms'
"""

from __future__ import annotations

import functools
import json
import math
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any, NoReturn, ParamSpec, TypeVar

import click
from rich.console import Console

from ojs_adapters.errors import OjsError, OjsValidationError
from ojs_adapters.migrate import load_document
from ojs_adapters.policy import RetryPolicy

#: Exit status for bad input (an OJS error was printed).
EXIT_INVALID = 1
#: Exit status of ``migrate`` when a job has no OJS equivalent and needs a decision.
EXIT_UNSUPPORTED = 3
#: Exit status for a bug in ojs-retry itself (sysexits EX_SOFTWARE).
EXIT_INTERNAL = 70
#: Columns of a table printed to a pipe or file when ``COLUMNS`` does not say (rich would
#: take 80 and fold most tables).
PIPED_WIDTH = 120

P = ParamSpec("P")
R = TypeVar("R")


def console() -> Console:
    """A console on the current stdout, as wide as ``COLUMNS`` says (rich reads it), else as
    the terminal, else (piped or redirected) ``PIPED_WIDTH``."""
    out = Console(highlight=False, soft_wrap=False)
    if not out.is_terminal and not os.environ.get("COLUMNS", "").isdigit():  # rich's reading
        out = Console(highlight=False, soft_wrap=False, width=PIPED_WIDTH)
    return out


def read_text(source: str) -> tuple[str, str]:
    """``(text, origin)`` of a path, or of stdin for ``-``."""
    origin = "<stdin>" if source == "-" else source
    try:
        if source == "-":
            return sys.stdin.read(), origin
        with open(source, encoding="utf-8") as handle:
            return handle.read(), origin
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise OjsValidationError(
            f"cannot read {origin}: {why}", code="INVALID_PAYLOAD",
            details={"field": origin, "rule": "must be a readable UTF-8 file, or - for stdin"},
        ) from None


def read_policy(source: str) -> tuple[RetryPolicy, str]:
    """The validated policy in ``source``, and where it was found in the document.

    The document may be the policy itself or a job envelope carrying it in
    ``options.retry`` (as the spec's examples do).
    """
    text, origin = read_text(source)
    doc = load_document(text, origin)
    where = "document"
    if isinstance(doc, Mapping) and isinstance(doc.get("options"), Mapping) \
            and isinstance(doc["options"].get("retry"), Mapping):
        doc, where = doc["options"]["retry"], "options.retry"
    return RetryPolicy.from_dict(doc), where


def reports_ojs_errors(command: Callable[P, R]) -> Callable[P, R]:
    """Turn an ``OjsError`` raised by a verb into the printed error and exit status 1."""

    @functools.wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except OjsError as err:
            fail(err, as_json=bool(kwargs.get("as_json")))
        except (click.ClickException, click.exceptions.Exit, SystemExit):
            raise
        except Exception as exc:  # a bug: say so in one line, not a traceback
            click.echo(f"error: internal error in ojs-retry: {type(exc).__name__}: {exc} "
                       "(please report it)", err=True)
            sys.exit(EXIT_INTERNAL)

    return wrapper


def fail(err: OjsError, *, as_json: bool) -> NoReturn:
    """Print ``err`` (JSON on stdout with ``--json``, text on stderr otherwise) and exit 1."""
    if as_json:
        click.echo(json.dumps({"ok": False, "error": err.to_dict()}, indent=2))
    else:
        click.echo(f"error: {err.code}: {err.message}", err=True)
        details = {"rule": err.message, **err.details}  # some core errors carry no rule
        for key in ("field", "rule", "value", "dialect"):
            if key in details and (key != "rule" or "field" in details):
                click.echo(f"  {key}: {details[key]}", err=True)
    sys.exit(EXIT_INVALID)


def print_json(data: Any) -> None:
    """One JSON document on stdout (a value JSON has no type for, such as the datetime a
    job's arguments decode to, as its ``str``)."""
    click.echo(json.dumps(data, indent=2, allow_nan=False, default=str))


def human_seconds(seconds: float) -> str:
    """A short reading of a delay: ``250ms``, ``45s``, ``1h 30m``, ``3d 4h``."""
    if math.isinf(seconds):
        return "inf"
    if seconds < 1:
        return f"{seconds * 1000:.4g}ms"
    if seconds < 60:
        return f"{seconds:.4g}s"
    parts: list[str] = []
    rest = round(seconds)
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)):
        amount, rest = divmod(rest, size)
        if amount:
            parts.append(f"{amount}{unit}")
    return " ".join(parts[:2])
