"""``serve_metrics``: which registry it serves, and the setups it refuses rather than serve zeros.

The multiprocess path on real forked workers is proven in
``tests/celery_worker/test_metrics_prefork.py``.
"""

from __future__ import annotations

import socket
import uuid
from pathlib import Path

import httpx
import pytest
from prometheus_client import REGISTRY, Counter, values

from ojs_adapters import OjsValidationError
from ojs_adapters.runtime.metrics import MULTIPROC_ENV, serve_metrics


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_without_multiprocess_mode_it_serves_this_process_registry(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MULTIPROC_ENV, raising=False)
    name = f"ojs_test_served_{uuid.uuid4().hex[:8]}"
    counter = Counter(name, "a counter of this process")
    counter.inc(3)
    port = _free_port()
    server, thread = serve_metrics(port, "127.0.0.1")
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        assert f"{name}_total 3.0" in text
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
        REGISTRY.unregister(counter)


def test_a_multiprocess_directory_that_does_not_exist_is_refused(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    missing = tmp_path / "absent"
    monkeypatch.setenv(MULTIPROC_ENV, str(missing))
    with pytest.raises(OjsValidationError) as caught:
        serve_metrics(_free_port(), "127.0.0.1")
    assert caught.value.code == "INVALID_ARGS"
    assert caught.value.details["field"] == MULTIPROC_ENV
    assert "is not a directory" in caught.value.message


def test_multiprocess_mode_switched_on_after_import_is_refused(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """prometheus-client chose in-memory values when imported (here, without the variable):
    summing the processes' files would serve zeros, so it says so instead."""
    if values.ValueClass is not values.MutexValue:
        pytest.skip(f"this pytest process was started with {MULTIPROC_ENV} set")
    monkeypatch.setenv(MULTIPROC_ENV, str(tmp_path))
    with pytest.raises(OjsValidationError) as caught:
        serve_metrics(_free_port(), "127.0.0.1")
    assert "set after prometheus_client was imported" in caught.value.message
    assert caught.value.details["rule"] == "set before prometheus_client is imported"
