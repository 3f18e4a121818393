"""Test settings: no broker, tasks run eagerly in the test, results kept in memory."""

from shop.settings import *  # noqa: F403

CELERY_BROKER_URL = "memory://"
CELERY_RESULT_BACKEND = "cache+memory://"  # where get_job_record() reads job records
CELERY_TASK_ALWAYS_EAGER = True
