"""The OJS retry policy, error history and dead-lettering for Celery tasks.

>>> from celery import Celery
>>> from celery_ext import OjsTask
>>> app = Celery("demo", broker="memory://", backend="cache+memory://")
>>> @app.task(base=OjsTask, retry_policy={"max_attempts": 5, "on_exhaustion": "dead_letter"})
... def charge(order_id):
...     ...

Public names: ``OjsTask``; ``get_job_record(task_id, app=app)``; the
exceptions ``JobDiscarded`` and ``JobDeadLettered`` that ``AsyncResult.get()``
raises for a job the policy ended (``.record`` holds its job record), and
``RetryRefused``, what ``self.retry(...)`` raises for an option the policy cannot honour;
``check_worker_settings(app)``; ``HEADER`` and ``DEAD_LETTER_HEADER``, the
message headers carrying the history. App settings read:
``ojs_default_retry_policy``, ``ojs_jitter_source``, ``ojs_dead_letter_queue``,
``ojs_visibility_heartbeat``, and for retries parked on the broker (``_parking``)
``ojs_park_after``, ``ojs_park_prefix``, ``ojs_park_poll_interval``.
"""

from celery_ext._checks import check_worker_settings
from celery_ext._current import current_job
from celery_ext._deadletter import DEAD_LETTER_HEADER
from celery_ext._headers import HEADER
from celery_ext.exceptions import JobDeadLettered, JobDiscarded, RetryRefused
from celery_ext.records import get_job_record
from celery_ext.task import OjsTask

__all__ = [
    "DEAD_LETTER_HEADER",
    "HEADER",
    "JobDeadLettered",
    "JobDiscarded",
    "OjsTask",
    "RetryRefused",
    "check_worker_settings",
    "current_job",
    "get_job_record",
]
