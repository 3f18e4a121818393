"""Where the policy comes from, when it is validated (RET-09, RET-10, RET-16); settings checks."""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import pytest
from celery import Celery, signals

from celery_ext import JobDeadLettered, JobDiscarded, OjsTask, RetryRefused, check_worker_settings
from ojs_adapters import JobRecord, OjsValidationError


def _app(**conf: Any) -> Celery:
    app = Celery("policy-tests", broker="memory://", backend="cache+memory://",
                 set_as_current=False)
    app.conf.update(conf)
    app.finalize()
    return app


def test_ret09_default_policy_when_none_given() -> None:
    app = _app()

    @app.task(shared=False, base=OjsTask)
    def plain() -> None: ...

    assert plain.policy().to_dict()["max_attempts"] == 3
    assert plain.policy().on_exhaustion == "discard"


def test_ret10_layers_merge_app_task_call() -> None:
    app = _app(ojs_default_retry_policy={"max_attempts": 7, "jitter": False})

    @app.task(shared=False, base=OjsTask,
              retry_policy={"initial_interval": "PT3S", "max_interval": "PT9S"})
    def layered() -> None: ...

    policy = layered.policy({"max_attempts": 2})
    assert (policy.max_attempts, policy.jitter, policy.initial_interval.total_seconds(),
            policy.max_interval.total_seconds()) == (2, False, 3.0, 9.0)
    assert layered.policy().max_attempts == 7


def test_ret16_bad_task_policy_raises_at_definition() -> None:
    app = _app()
    with pytest.raises(OjsValidationError) as info:
        @app.task(shared=False, base=OjsTask, retry_policy={"max_attempts": -1})
        def bad() -> None: ...
    assert info.value.code == "INVALID_RETRY_POLICY"
    assert info.value.details["field"] == "max_attempts"


def test_ret16_bad_subclass_policy_raises_at_class_definition() -> None:
    with pytest.raises(OjsValidationError) as info:
        class Bad(OjsTask):
            retry_policy: ClassVar[dict[str, Any]] = {"backoff_coefficient": 0.5}
    assert info.value.details["field"] == "backoff_coefficient"

    class Good(OjsTask):
        retry_policy: ClassVar[dict[str, Any]] = {"max_attempts": 4}

    app = _app()
    task = app.register_task(Good())
    assert task.policy().max_attempts == 4


def test_ret16_lazy_app_validates_before_anything_is_sent() -> None:
    """An unfinalized app builds task classes lazily: the error comes at first use."""
    app = Celery("lazy", broker="memory://", set_as_current=False)

    @app.task(shared=False, base=OjsTask, retry_policy={"on_exhaustion": "explode"})
    def lazy() -> None: ...

    with pytest.raises(OjsValidationError):
        lazy.apply_async(queue="never-consumed")


def test_ret16_ret19_bad_call_policy_raises_in_the_caller() -> None:
    app = _app()

    @app.task(shared=False, base=OjsTask)
    def sent() -> None: ...

    with pytest.raises(OjsValidationError) as info:
        sent.apply_async(queue="never-consumed", retry_policy={"initial_interval": "1 second"})
    assert info.value.details["field"] == "initial_interval"
    with pytest.raises(OjsValidationError) as info:  # OJS keys mixed with Celery's publish ones
        sent.apply_async(queue="never-consumed",
                         retry_policy={"max_attempts": 2, "max_retries": 3})
    assert info.value.details["field"] == "retry_policy.max_retries"
    # Only publish keys: Celery's own meaning (test_first_contact proves it reaches kombu).


def test_ret16_bad_app_default_raises_in_the_caller() -> None:
    """A bad app-wide default fails where the task is built or sent, never in a worker."""
    app = Celery("bad-default", broker="memory://", set_as_current=False)
    app.conf.ojs_default_retry_policy = {"jitter": "yes"}

    @app.task(shared=False, base=OjsTask)
    def uses_default() -> None: ...

    with pytest.raises(OjsValidationError) as info:
        uses_default.apply_async(queue="never-consumed")
    assert info.value.details["field"] == "jitter"


@pytest.mark.parametrize("option, value", [
    ("autoretry_for", (ValueError,)), ("max_retries", 5), ("retry_backoff", True),
    ("retry_backoff_max", 60), ("retry_jitter", False), ("default_retry_delay", 10),
    ("retry_on_worker_lost", True),
])
def test_celery_retry_options_are_rejected_not_combined(option: str, value: Any) -> None:
    app = _app()
    with pytest.raises(OjsValidationError) as info:
        @app.task(shared=False, base=OjsTask, **{option: value})
        def mixed() -> None: ...
    assert info.value.details["field"] == option
    assert "retry_policy" in str(info.value) or "attempt" in str(info.value)


def test_terminal_exceptions_survive_the_json_result_serializer() -> None:
    """Celery keeps only type, module and args with JSON: the record is in args."""
    app = _app(result_serializer="json")
    record = JobRecord(id="t-1", type="x", queue="q", max_attempts=2, state="discarded",
                       attempt=2, dead_lettered=True, outcome="dead_letter")
    stored = app.backend.prepare_exception(JobDeadLettered("gone", record.to_dict()))
    assert isinstance(stored, dict)
    rebuilt = app.backend.exception_to_python(stored)
    assert isinstance(rebuilt, JobDeadLettered) and isinstance(rebuilt, JobDiscarded)
    assert rebuilt.record == record
    assert str(rebuilt) == "gone"


def test_worker_settings_check_names_each_problem() -> None:
    app = Celery("checks", broker="redis://127.0.0.1:6379/0", backend="rpc://",
                 set_as_current=False)
    app.conf.broker_transport_options = {"visibility_timeout": 30}

    @app.task(shared=False, base=OjsTask, acks_late=False, reject_on_worker_lost=False,
              retry_policy={"max_interval": "PT1M"}, time_limit=45)
    def careless() -> None: ...

    problems = " | ".join(check_worker_settings(app))
    for needle in ("acks_late is off", "reject_on_worker_lost is off", "RPCBackend"):
        assert needle in problems
    assert "visibility_timeout" not in problems  # the heartbeat keeps deliveries reserved
    app.conf.ojs_visibility_heartbeat = False
    problems = " | ".join(check_worker_settings(app))
    for needle in ("longest retry countdown (60s)", "longest time limit (45s)"):
        assert needle in problems
    assert check_worker_settings(_app()) == []
    app.conf.ojs_park_after = "soon"  # reported; retries then park after the default 60 s
    assert "ojs_park_after must be a number of seconds > 0" in " | ".join(
        check_worker_settings(app))


def test_worker_settings_check_names_a_result_expiry_shorter_than_a_task_waits() -> None:
    """Records and claims live ``result_expires``: shorter than a countdown or a time
    limit, they can lapse under a running or waiting attempt (RET-12)."""
    app = Celery("checks-expiry", broker="memory://", backend="redis://127.0.0.1:6379/0",
                 set_as_current=False)
    app.conf.result_expires = 120

    @app.task(shared=False, base=OjsTask, retry_policy={"max_interval": "PT10M"})
    def slow_retries() -> None: ...

    @app.task(shared=False, base=OjsTask, time_limit=300)
    def long_runs() -> None: ...

    @app.task(shared=False, base=OjsTask, time_limit=60, retry_policy={"max_interval": "PT1M"})
    def fits() -> None: ...

    problems = check_worker_settings(app)
    named = [p for p in problems if "result_expires (120s)" in p]
    assert len(named) == 2
    assert any(p.startswith(slow_retries.name) and "(600s)" in p for p in named)
    assert any(p.startswith(long_runs.name) and "(300s)" in p for p in named)
    app.conf.result_expires = 3600
    app.backend.expires = 3600  # the backend read it at creation
    assert not [p for p in check_worker_settings(app) if "result_expires" in p]


def test_worker_start_logs_each_problem(caplog: pytest.LogCaptureFixture) -> None:
    """The worker_init receiver logs the check's findings as warnings."""
    app = Celery("checks-log", broker="memory://", backend="rpc://", set_as_current=False)

    @app.task(shared=False, base=OjsTask, acks_late=False)
    def careless() -> None: ...

    with caplog.at_level(logging.WARNING, logger="celery_ext"):
        signals.worker_init.send(sender=type("FakeWorker", (), {"app": app})())
    messages = [r.getMessage() for r in caplog.records if r.name == "celery_ext"]
    assert any("acks_late is off" in m for m in messages)
    assert any("RPCBackend" in m for m in messages)


def test_retry_options_the_policy_cannot_honour_are_refused() -> None:
    """OjsTask.retry refuses what the policy cannot honour (a routing option, throw=False,
    a max_retries that is no count), naming the field; a direct call otherwise raises
    ``exc`` as Celery's direct call does."""
    app = _app()

    @app.task(shared=False, base=OjsTask)
    def strict() -> None: ...

    for given, field in [({"queue": "other"}, "queue"), ({"throw": False}, "throw"),
                         ({"max_retries": -1}, "max_retries"), ({"eta": 5}, "eta"),
                         ({"args": object()}, "args"), ({"countdown": "soon"}, "countdown"),
                         ({"countdown": float("inf")}, "countdown")]:
        with pytest.raises(RetryRefused) as info:
            strict.retry(**given)
        assert (info.value.code, info.value.details["field"]) == ("INVALID_ARGS", field)
    with pytest.raises(KeyError):
        strict.retry(exc=KeyError("k"), max_retries=9, countdown=1)


def test_a_proposed_policy_that_is_not_the_same_says_so() -> None:
    """autoretry_for=(ValueError,): the proposal retries every error (OJS has no
    allow-list); the message offered it as "the same" where migrate calls it lossy."""
    app = _app()
    with pytest.raises(OjsValidationError) as info:
        @app.task(shared=False, base=OjsTask, autoretry_for=(ValueError,), retry_backoff=True)
        def mixed() -> None: ...
    said = str(info.value)
    assert "these options translate to retry_policy=" in said
    assert "which is not the same: autoretry_for: Celery retries only ValueError" in said
    assert info.value.details["suggested_policy"]["max_attempts"] == 4
