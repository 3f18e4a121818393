"""Settings of the example shop (production-like: Redis broker and result backend)."""

SECRET_KEY = "example-only-not-secret"
DEBUG = False
INSTALLED_APPS = ["orders"]
DATABASES: dict[str, dict[str, str]] = {}
USE_TZ = True

CELERY_BROKER_URL = "redis://127.0.0.1:6379/0"
CELERY_RESULT_BACKEND = "redis://127.0.0.1:6379/1"
# app.conf.ojs_default_retry_policy: every OjsTask's default, merged under its own policy.
CELERY_OJS_DEFAULT_RETRY_POLICY = {
    "max_attempts": 3,
    "initial_interval": "PT30S",
    "max_interval": "PT10M",
    "on_exhaustion": "dead_letter",
}
