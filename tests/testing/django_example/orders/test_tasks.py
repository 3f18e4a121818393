"""The shop's own retry tests: pytest-django settings, the ``ojs_retries`` fixture."""

import pytest
from django.conf import settings

from celery_ext import JobDeadLettered, get_job_record
from orders.tasks import GATEWAY_ANSWERS, charge


@pytest.fixture(autouse=True)
def gateway():
    GATEWAY_ANSWERS.clear()
    yield GATEWAY_ANSWERS
    GATEWAY_ANSWERS.clear()


def test_policy_comes_from_django_settings():
    assert settings.CELERY_TASK_ALWAYS_EAGER
    policy = charge.policy()  # CELERY_OJS_DEFAULT_RETRY_POLICY under the task's own
    assert (policy.max_attempts, policy.on_exhaustion) == (3, "dead_letter")
    assert policy.non_retryable_errors == ("payment.card_stolen",)


def test_declined_twice_then_charged(ojs_retries, gateway):
    ojs_retries.jitter_sample = 0.5  # exact countdowns: the policy's schedule
    gateway.extend(["card_declined", "card_declined"])
    result = charge.delay(7)
    assert result.get() == "order 7 charged"
    assert ojs_retries.attempts(result.id) == 3
    assert ojs_retries.countdowns(result.id) == [30.0, 60.0]  # a worker would wait 90 s
    assert ojs_retries.outcome(result.id) == "completed"


def test_declined_every_time_dead_letters(ojs_retries, gateway):
    gateway.extend(["card_declined"] * 3)
    result = charge.delay(8)
    with pytest.raises(JobDeadLettered) as caught:
        result.get()
    assert caught.value.record.attempt == 3
    assert ojs_retries.outcome(result.id) == "dead_letter"
    assert get_job_record(result.id, app=charge.app) == ojs_retries.record(result.id)


def test_stolen_card_is_not_retried(ojs_retries, gateway):
    gateway.append("card_stolen")
    result = charge.delay(9)
    assert ojs_retries.attempts(result.id) == 1
    assert ojs_retries.countdowns(result.id) == []
    assert ojs_retries.record(result.id).errors[0].code == "NON_RETRYABLE_ERROR"
