"""No module of the adapters is over 300 lines (STYLE: small modules with one job)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: The most lines a module under ``celery_ext/`` or ``dramatiq_ext/`` may have.
MAX_LINES = 300


def modules() -> list[Path]:
    return sorted(p for package in ("celery_ext", "dramatiq_ext")
                  for p in (ROOT / package).rglob("*.py"))


def test_the_adapter_packages_have_modules_to_measure() -> None:
    assert len(modules()) > 10  # the check below would pass on a wrong ROOT


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_adapter_module_exceeds_300_lines(path: Path) -> None:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, (f"{path.relative_to(ROOT)} has {lines} lines, over "
                                f"{MAX_LINES}: split it at a natural seam")
