"""The Celery app of the restart test, alike in the test and its worker subprocess.

``celery -A tests.restart.celery_app worker`` builds ``app`` from the JSON in
``OJS_RESTART_CELERY`` (a ``Config``); the test builds the same app to send the jobs
and read their records. The broker is the private server the test restarts; the
result backend (job records, attempt claims) is a private Redis with AOF (the same
server as the broker in the Redis cell). The worker reconnects for ever.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from celery import Celery

from celery_ext import OjsTask
from celery_ext._headers import HeaderState
from tests.restart.support import POLICY, RunLog, body

#: Environment variable carrying the ``Config`` as JSON.
CONFIG_ENV = "OJS_RESTART_CELERY"
#: Name of the job task.
TASK_NAME = "ojs_restart.job"


@dataclass(frozen=True)
class Config:
    broker: str
    backend: str
    queue: str
    runs: str
    #: Redis ``visibility_timeout`` (seconds) of the broker transport.
    visibility: float = 3600.0
    #: ``ojs_park_after``: retries waiting longer are parked on the broker (``None``: never).
    park_after: float | None = 60.0

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def build_app(config: Config) -> Celery:
    app = Celery("ojs_restart", broker=config.broker, backend=config.backend,
                 set_as_current=False)
    transport: dict[str, Any] = {}
    if config.broker.startswith("redis"):
        transport = {"visibility_timeout": config.visibility}
    app.conf.update(
        broker_transport_options=transport,
        result_expires=600,
        task_default_queue=config.queue,
        broker_connection_retry_on_startup=True,
        broker_connection_retry=True,
        broker_connection_max_retries=None,
        worker_enable_remote_control=False,
        worker_hijack_root_logger=False,
        ojs_park_after=config.park_after,
    )
    log = RunLog(Path(config.runs))

    @app.task(shared=False, base=OjsTask, bind=True, name=TASK_NAME, retry_policy=POLICY)
    def job(self: Any, key: str) -> str:
        return body(log, key, HeaderState.from_headers(self.request.headers).attempt)

    return app


#: The worker's app; ``None`` when imported without the variable (the test, doctests).
app: Celery | None = (build_app(Config(**json.loads(os.environ[CONFIG_ENV])))
                      if CONFIG_ENV in os.environ else None)
