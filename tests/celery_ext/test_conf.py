"""``setting`` reads what ``app.conf.get`` reads: the same names, maps and defaults."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from celery import Celery

from celery_ext._conf import setting


class _Django:
    CELERY_OJS_VISIBILITY_HEARTBEAT = False
    CELERY_BROKER_URL = "memory://"


def _apps() -> list[Any]:
    plain = Celery("plain", broker="memory://", set_as_current=False)
    changed = Celery("changed", broker="memory://", set_as_current=False)
    changed.conf.ojs_visibility_heartbeat = False
    changed.conf.ojs_backend_retry = {"tries": 2}
    namespaced = Celery("namespaced", set_as_current=False)
    namespaced.config_from_object(_Django, namespace="CELERY")
    return [plain, changed, namespaced]


@pytest.mark.parametrize("app", _apps(), ids=["plain", "changed", "namespace"])
@pytest.mark.parametrize("key", ["ojs_visibility_heartbeat", "ojs_backend_retry",
                                 "broker_url", "task_default_queue", "no_such_setting"])
def test_setting_reads_what_conf_get_reads(app: Any, key: str) -> None:
    assert setting(app, key, "fallback") == app.conf.get(key, "fallback")


def test_a_namespaced_setting_is_found() -> None:
    assert setting(_apps()[2], "ojs_visibility_heartbeat", True) is False


def test_the_app_default_policy_follows_its_setting_changed_in_place_or_replaced() -> None:
    from celery_ext._policy import APP_DEFAULT_SETTING, app_policy, task_policy
    from ojs_adapters import OjsValidationError

    app = Celery("policies", broker="memory://", set_as_current=False)
    assert app_policy(app).max_attempts == 3  # the OJS default
    default = {"max_attempts": 5}
    app.conf[APP_DEFAULT_SETTING] = default
    assert app_policy(app).max_attempts == 5
    default["max_attempts"] = 7  # mutated in place: not the cached policy
    assert app_policy(app).max_attempts == 7
    task_data = {"backoff_strategy": "none"}
    assert task_policy(task_data, app).max_attempts == 7
    task_data["max_attempts"] = 2
    assert task_policy(task_data, app).max_attempts == 2
    app.conf[APP_DEFAULT_SETTING] = {"max_attempts": "many"}
    for _ in range(2):  # an invalid setting is refused every time, never cached
        with pytest.raises(OjsValidationError):
            app_policy(app)


class _DjangoPolicy:
    CELERY_BROKER_URL = "memory://"
    CELERY_OJS_DEFAULT_RETRY_POLICY: ClassVar[dict[str, int]] = {"max_attempts": 9}


def test_a_namespaced_setting_first_read_while_the_config_loads_is_found_after() -> None:
    from celery_ext import OjsTask
    from celery_ext._policy import APP_DEFAULT_SETTING, app_policy

    app = Celery("django-like", set_as_current=False)
    app.config_from_object(_DjangoPolicy, namespace="CELERY")

    @app.task(base=OjsTask, shared=False)
    def add(x: int) -> int:  # defined (and its policy read) before the config loads
        return x

    assert add.name
    assert setting(app, APP_DEFAULT_SETTING) == {"max_attempts": 9}
    assert app_policy(app).max_attempts == 9


def test_an_in_place_edit_the_schema_refuses_is_not_taken_for_the_cached_policy() -> None:
    from celery_ext._policy import _built
    from ojs_adapters import OjsValidationError

    data: dict[str, Any] = {"max_attempts": 1}
    assert _built(data, None).max_attempts == 1
    data["max_attempts"] = True  # equal to 1, but not a number to the schema
    with pytest.raises(OjsValidationError):
        _built(data, None)
