"""Make the packages named in ``OJS_BLOCK`` unimportable, as if their extra were not installed.

Put this folder first on ``PYTHONPATH`` of a subprocess (a worker started by its own
command line, a sender script): every ``import`` of a blocked top-level package then
fails with ``ModuleNotFoundError``, exactly as in a venv without it.
"""

from __future__ import annotations

import os
import sys
from importlib.abc import MetaPathFinder
from typing import Any

_BLOCKED = frozenset(filter(None, os.environ.get("OJS_BLOCK", "").split(",")))


class _Blocker(MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        if fullname.partition(".")[0] in _BLOCKED:
            raise ModuleNotFoundError(f"No module named {fullname!r} (blocked by OJS_BLOCK)",
                                      name=fullname)


if _BLOCKED:
    sys.meta_path.insert(0, _Blocker())
