"""The pytest plugin (entry point ``pytest11``) behind ``pytest --pyargs conformance``.

Options: ``--ojs-framework celery|dramatiq|all`` (default all), ``--ojs-broker URL``
(repeatable; ``memory`` for the embedded default), ``--ojs-report DIR`` for the
matrix as JSON and Markdown. Loading the plugin imports no framework.
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ojs-conformance", "OJS retry conformance suite")
    group.addoption("--ojs-framework", default="all",
                    help="celery, dramatiq or all (default: all)")
    group.addoption("--ojs-broker", action="append", default=None,
                    help="broker URL, repeatable; 'memory' is the embedded default "
                         "(default: memory)")
    group.addoption("--ojs-report", default=None,
                    help="folder to write matrix.json and matrix.md into")
