"""The Celery app of the extension tests' worker subprocesses (``celery -A`` this module)."""

from __future__ import annotations

from typing import Any

import redis
from celery import Celery
from celery.signals import worker_ready

from celery_ext import OjsTask
from ojs_adapters.runtime.budget import RetryBudgets
from tests.extensions.jobs import BUDGET_MINIMUM, BUDGET_SHARE, POLICIES, Config, Runs, body


def build_app(config: Config) -> Celery:
    """The app, its tasks (one per job, ``<ns>.<job>``) and its shared retry budgets."""
    app = Celery(config.ns, broker=config.redis_url, backend=config.redis_url,
                 set_as_current=False)
    prefix = {"global_keyprefix": f"{config.ns}:"}
    app.conf.update(
        broker_transport_options={**prefix, "visibility_timeout": 60},
        result_backend_transport_options=prefix, result_expires=600,
        broker_connection_retry_on_startup=True, task_default_queue=config.queue,
        worker_hijack_root_logger=False, worker_prefetch_multiplier=4,
        ojs_retry_budgets=RetryBudgets(redis.Redis.from_url(config.redis_url),
                                       share=BUDGET_SHARE, minimum=BUDGET_MINIMUM),
    )
    runs = Runs(config)
    for job, policy in POLICIES.items():
        options: dict[str, Any] = {"retry_policy": policy}
        if job == "limited":
            options["retry_budget"] = config.dependency

        def run(self: Any, n: int, job: str = job) -> str:
            return body(job, n, self.ojs, runs)

        app.task(run, shared=False, base=OjsTask, bind=True, name=f"{config.ns}.{job}",
                 **options)
    return app


_config = Config.from_env()
#: The worker's app; ``None`` when imported without the configuration (doctest collection).
app: Celery | None = build_app(_config) if _config else None


@worker_ready.connect
def _ready(sender: Any = None, **_: Any) -> None:
    if _config is not None:
        Runs(_config).ready(str(getattr(sender, "hostname", "celery")))
