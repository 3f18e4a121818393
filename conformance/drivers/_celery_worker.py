"""The app a prefork worker subprocess of the Celery driver runs (``celery -A`` this module).

Configured by the ``OJS_CONFORMANCE_CELERY`` environment variable (an
``AppConfig`` as JSON) that the driver sets. Only a pool process of a real
prefork worker can be SIGKILLed (a ``crash`` step) or hit a hard time limit.
"""

from __future__ import annotations

import os

from celery import Celery

from conformance.drivers._celery_app import AppConfig, build_app

#: Environment variable carrying the run's ``AppConfig``.
CONFIG_ENV = "OJS_CONFORMANCE_CELERY"

#: The worker's app; ``None`` when imported without the variable (e.g. by doctest collection).
app: Celery | None = (build_app(AppConfig.from_json(os.environ[CONFIG_ENV]))
                      if CONFIG_ENV in os.environ else None)
