"""Issue 10 in process: validation at the caller, defaults, the gauge and the log fields."""

from __future__ import annotations

import logging
from typing import Any

import dramatiq
import pytest
from celery import Celery
from dramatiq.brokers.stub import StubBroker
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from celery_ext import OjsTask
from celery_ext._budgets import budgets_of
from celery_ext._headers import HeaderState
from dramatiq_ext import KEY_OPTION, OjsRetries, current_job, get_job_record
from ojs_adapters import OjsValidationError, RetryPolicy, check_idempotency_key, decide
from ojs_adapters.runtime.budget import LocalRetryBudget, RedisRetryBudget, RetryBudgets
from ojs_adapters.runtime.events import DecisionEvent
from ojs_adapters.runtime.logs import LogDecisions
from ojs_adapters.runtime.metrics import PrometheusMetrics


@given(st.text(min_size=1, max_size=64))
def test_r6_any_key_of_1_to_64_characters_is_accepted(key: str) -> None:
    assert check_idempotency_key(key) == key


@pytest.mark.parametrize("bad", ["", "x" * 65, 42, None, b"bytes"])
def test_r6_a_bad_key_names_the_field_and_the_rule(bad: Any) -> None:
    with pytest.raises(OjsValidationError) as caught:
        check_idempotency_key(bad)
    assert caught.value.code == "INVALID_ARGS"
    assert caught.value.details["field"] == "idempotency_key"
    assert "64" in caught.value.details["rule"]


def test_r7_budgets_one_per_dependency_with_overrides() -> None:
    budgets = RetryBudgets(share=0.2, minimum=0, overrides={"search": {"share": 0.5}})
    assert budgets.get("payments") is budgets.get("payments")
    assert isinstance(budgets.get("payments"), LocalRetryBudget)
    assert budgets.get("search").share == 0.5 and budgets.get("payments").share == 0.2
    with pytest.raises(OjsValidationError) as caught:
        RetryBudgets(share=1.5)
    assert caught.value.details["field"] == "share"


def test_r7_utilization_gauge_per_dependency() -> None:
    registry = CollectorRegistry()
    PrometheusMetrics(registry)
    budgets = RetryBudgets(share=0.5, minimum=0)
    budget = budgets.get("gauge-dep")
    for _ in range(4):
        budget.record_execution()
    assert budget.allow_retry()  # 1 of the 2 allowed
    text = generate_latest(registry).decode()
    assert 'ojs_retry_budget_utilization_ratio{dependency="gauge-dep"} 0.5' in text


def test_r10_decision_log_carries_key_and_dependency(caplog: pytest.LogCaptureFixture) -> None:
    decision = decide(RetryPolicy.from_dict({"jitter": False}), 1, RuntimeError("down"))
    event = DecisionEvent(framework="celery", job_id="j1", task="t", queue="q",
                          max_attempts=3, decision=decision, idempotency_key="k-1",
                          dependency="payments")
    with caplog.at_level(logging.INFO, logger="ojs_adapters.retry"):
        LogDecisions()(event)
    fields = caplog.records[-1].ojs  # type: ignore[attr-defined]
    assert fields["idempotency_key"] == "k-1" and fields["dependency"] == "payments"


# -- Celery ---------------------------------------------------------------------------


def _celery_app(broker: str = "memory://") -> Celery:
    return Celery("ext-wiring", broker=broker, backend="cache+memory://", set_as_current=False)


def test_celery_bad_budget_name_fails_at_definition() -> None:
    app = _celery_app()
    def job() -> None:
        return None

    with pytest.raises(OjsValidationError) as caught:
        app.task(job, base=OjsTask, name="bad", retry_budget="", shared=False)
        app.tasks["bad"]  # finalizing the app builds the task class
    assert caught.value.details["field"] == "retry_budget"


def test_celery_key_is_set_at_send_or_taken_from_the_caller() -> None:
    app = _celery_app()
    sent: list[dict[str, Any]] = []

    @app.task(base=OjsTask, bind=True, name="keyed", shared=False)
    def keyed(self: Any) -> str:
        return self.ojs.idempotency_key  # type: ignore[no-any-return]

    def capture(*args: Any, **kwargs: Any) -> None:
        sent.append(kwargs.get("headers") or {})

    with app.producer_or_acquire() as producer:
        producer.publish = capture  # type: ignore[method-assign]
        keyed.apply_async(producer=producer)
        keyed.apply_async(producer=producer, idempotency_key="order-7")
    generated, given_key = (HeaderState.from_headers(h).idempotency_key for h in sent)
    assert generated is not None and len(generated) == 36
    assert given_key == "order-7"
    with pytest.raises(OjsValidationError) as caught:
        keyed.apply_async(idempotency_key="x" * 65)
    assert caught.value.details["field"] == "idempotency_key"
    # eager: no ojs header, the task id is the key
    result = keyed.apply()
    assert result.get() == result.id


def test_celery_budgets_default_to_the_broker_redis() -> None:
    assert budgets_of(_celery_app()).client is None
    assert isinstance(budgets_of(_celery_app()).get("d"), LocalRetryBudget)
    redis_app = _celery_app("redis://127.0.0.1:6379/0")
    assert isinstance(budgets_of(redis_app).get("d"), RedisRetryBudget)
    assert budgets_of(redis_app) is budgets_of(redis_app)
    own = RetryBudgets(share=0.1)
    redis_app.conf.ojs_retry_budgets = own
    assert budgets_of(redis_app) is own


# -- Dramatiq -------------------------------------------------------------------------


def _stub() -> StubBroker:
    broker = StubBroker()
    broker.add_middleware(OjsRetries(default_policy={"max_attempts": 2,
                                                     "initial_interval": "PT0.01S"}))
    broker.emit_after("process_boot")
    return broker


def test_dramatiq_bad_budget_or_key_fails_in_the_caller() -> None:
    broker = _stub()
    with pytest.raises(OjsValidationError) as caught:
        dramatiq.actor(lambda: None, broker=broker, actor_name="bad", retry_budget=7)
    assert caught.value.details["field"] == "retry_budget"
    actor = dramatiq.actor(lambda: None, broker=broker, actor_name="ok")
    with pytest.raises(OjsValidationError) as caught:
        actor.send_with_options(idempotency_key="")
    assert caught.value.details["field"] == "idempotency_key"


def test_dramatiq_key_reaches_the_actor_and_survives_the_retry() -> None:
    broker = _stub()
    seen: list[tuple[int, str]] = []

    @dramatiq.actor(broker=broker, actor_name="keyed_stub", retry_budget="stub-dep")
    def keyed_stub() -> None:
        job = current_job()
        assert job is not None
        seen.append((job.attempt, job.idempotency_key))
        if job.attempt == 1:
            raise RuntimeError("once")

    message = keyed_stub.send()
    key = message.options[KEY_OPTION]
    worker = dramatiq.Worker(broker, worker_timeout=10)
    worker.start()
    try:
        broker.join(keyed_stub.queue_name)
        worker.join()
    finally:
        worker.stop()
    assert seen == [(1, key), (2, key)]
    assert current_job() is None  # cleared outside an attempt
    record = get_job_record(message.message_id, broker=broker)
    assert record is not None and record.extra["idempotency_key"] == key
    budget = next(m for m in broker.middleware if isinstance(m, OjsRetries))
    assert isinstance(budget.retry_budgets(broker).get("stub-dep"), LocalRetryBudget)


def test_celery_current_job_is_self_ojs_for_code_without_self() -> None:
    """``celery_ext.current_job()`` names the running attempt as ``dramatiq_ext`` does."""
    from celery_ext import current_job as celery_current_job
    from ojs_adapters.testing import instant_retries

    app = _celery_app()
    app.conf.task_always_eager = True
    seen: list[tuple[Any, Any]] = []

    def helper() -> Any:  # code the task calls, with no ``self`` at hand
        return celery_current_job()

    @app.task(base=OjsTask, bind=True, name="twice", shared=False,
              retry_policy={"max_attempts": 2, "jitter": False})
    def twice(self: Any) -> None:
        seen.append((helper(), self.ojs))
        if len(seen) == 1:
            raise RuntimeError("first attempt fails")

    assert celery_current_job() is None  # outside a task
    with instant_retries():
        twice.apply_async(idempotency_key="order-9").get()
    assert [(job.attempt, job.idempotency_key) for job, _ in seen] == [(1, "order-9"),
                                                                       (2, "order-9")]
    assert all(job == own for job, own in seen)
