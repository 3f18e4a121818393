"""``ojs-retry web`` logs the project's INFO lines (the audit log) and only the warnings of
pika, kombu and amqp; logging someone configured already is left alone."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.dramatiq_ext.harness import pika_url
from tests.web.support import ROOT, free_port, wait_for

TOKEN = "log-test-token-0123456789"


def _levels(before: str) -> str:
    """The levels a fresh interpreter ends with after ``before`` and ``console_logging()``."""
    code = (f"import logging\n{before}\n"
            "from ojs_adapters.web._logs import console_logging\n"
            "done = console_logging()\n"
            "names = ['pika', 'kombu', 'amqp', 'ojs_adapters.web.audit', 'dramatiq_ext']\n"
            "print(done, *(logging.getLevelName(logging.getLogger(n).getEffectiveLevel())"
            " for n in names))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code], env=env, check=True,
                          capture_output=True, text=True).stdout.strip()


def test_broker_clients_log_warnings_only_and_configured_logging_is_kept() -> None:
    assert _levels("") == "True WARNING WARNING WARNING INFO INFO"
    configured = _levels("logging.basicConfig(level=logging.DEBUG)")
    assert configured == "False DEBUG DEBUG DEBUG DEBUG DEBUG"
    own_level = _levels("logging.getLogger('ojs_adapters').setLevel(logging.ERROR)")
    assert own_level == "True WARNING WARNING WARNING ERROR INFO"


@pytest.mark.broker
def test_ojs_retry_web_on_rabbitmq_logs_the_audit_not_pika(amqp_url: str,
                                                           tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "OJS_WEB_TOKEN": TOKEN, "PYTHONPATH": str(ROOT)}
    script = shutil.which("ojs-retry", path=str(Path(sys.executable).parent)) or "ojs-retry"
    command = [script, "web", "--framework", "dramatiq",
               "--broker", pika_url(amqp_url), "--port", str(port)]
    log = tmp_path / "web.log"
    with log.open("wb") as out:
        server = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=out,
                                  stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        def up() -> bool:
            assert server.poll() is None, log.read_text()
            try:  # /metrics opens the broker connection: pika logs then, if anywhere
                return httpx.get(url + "/metrics", timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, "ojs-retry web", timeout=30)
        with httpx.Client(base_url=url) as client:
            found = re.search(r'name="csrf" value="([^"]+)"', client.get("/login").text)
            assert found is not None
            login = client.post("/login", data={"token": TOKEN, "csrf": found.group(1)})
            assert login.status_code == 303
        wait_for(lambda: "action=login" in log.read_text(), "the audit line")
    finally:
        server.terminate()
        server.wait(10)
    text = log.read_text()
    assert "ojs_adapters.web.audit console action=login who=operator" in text
    assert "Created channel" not in text and "Connection workflow succeeded" not in text, text
