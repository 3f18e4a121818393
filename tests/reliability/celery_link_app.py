"""The Celery app of the link-cut test, alike in the test and its worker subprocess.

``celery -A tests.reliability.celery_link_app worker`` builds ``app`` from the JSON in
``OJS_LINK_CELERY``: a broker URL (through the test's ``Proxy``), a result backend
(job records, claims, leases) reached directly, a queue and a run log. Its one task
notes each run and then sleeps: long enough for the test to cut the broker link
while it runs.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from celery import Celery

from celery_ext import OjsTask
from celery_ext._headers import HeaderState
from tests.restart.support import RunLog

#: Environment variable carrying the config as JSON.
CONFIG_ENV = "OJS_LINK_CELERY"
#: Name of the task.
TASK_NAME = "ojs_link.sleepy"
#: Its policy: a lost attempt would be retried (and show) after half a second.
POLICY = {"max_attempts": 3, "initial_interval": "PT0.5S", "jitter": False}


def build_app(config: dict[str, str]) -> Celery:
    app = Celery("ojs_link", broker=config["broker"], backend=config["backend"],
                 set_as_current=False)
    app.conf.update(
        task_default_queue=config["queue"],
        result_expires=600,
        broker_connection_retry_on_startup=True,
        broker_connection_retry=True,
        broker_connection_max_retries=None,
        worker_enable_remote_control=False,
        worker_hijack_root_logger=False,
    )
    log = RunLog(Path(config["runs"]))

    @app.task(shared=False, base=OjsTask, bind=True, name=TASK_NAME, retry_policy=POLICY)
    def sleepy(self: Any, key: str, seconds: float) -> str:
        log.append(key, HeaderState.from_headers(self.request.headers).attempt)
        time.sleep(seconds)
        return "ok"

    return app


#: The worker's app; ``None`` when imported without the variable (the test, doctests).
app: Celery | None = (build_app(json.loads(os.environ[CONFIG_ENV]))
                      if CONFIG_ENV in os.environ else None)
