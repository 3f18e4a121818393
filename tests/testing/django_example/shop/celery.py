"""The project's Celery app: settings from Django's, under the ``CELERY_`` namespace."""

import os

from celery import Celery

from celery_ext import OjsTask

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")

app = Celery("shop", task_cls=OjsTask)  # every task of the project follows the OJS policy
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
