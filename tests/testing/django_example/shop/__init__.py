"""A minimal Django project whose Celery tasks follow the OJS retry policy."""

from shop.celery import app as celery_app

__all__ = ["celery_app"]
