"""What the ``ojs-retry`` command's tests share: a CliRunner call and an OJS-error check."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result

from ojs_adapters.cli import main


def run(*args: str, input: str | None = None) -> Result:
    """``ojs-retry *args`` in process, ``input`` on stdin."""
    return CliRunner().invoke(main, list(args), input=input)


def write(tmp_path: Path, data: Any, name: str = "policy.json") -> str:
    """``data`` (text, or JSON for anything else) in ``tmp_path/name``; the path."""
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def assert_ojs_error(result: Result, code: str, field: str) -> None:
    """The command failed with exit 1 and the OJS error ``code`` on ``field``, no traceback."""
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert f"error: {code}" in result.stderr
    assert f"field: {field}" in result.stderr
    assert "rule:" in result.stderr
