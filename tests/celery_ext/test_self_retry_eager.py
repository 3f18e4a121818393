"""``self.retry(...)`` in eager runs: the policy's meaning inside ``instant_retries()``
(every attempt in the caller), the body once otherwise, as Celery's direct call."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from celery import Celery
from celery.exceptions import Retry

from celery_ext import JobDiscarded, OjsTask, RetryRefused, get_job_record
from ojs_adapters.testing import instant_retries
from tests.celery_ext import retry_steps
from tests.celery_ext.retry_steps import CALLS, HOOKED


def _retrying(**policy: Any) -> Any:
    app = Celery(f"eager-{uuid.uuid4().hex[:8]}", broker="memory://",
                 backend="cache+memory://", set_as_current=False)

    @app.task(shared=False, base=OjsTask, bind=True, name="eager.retrying",
              retry_policy={"max_attempts": 3, "initial_interval": "PT0.1S", "jitter": False,
                            **policy})
    def task(self: Any, step: str, n: int = 0) -> str:
        return retry_steps.retrying(self, step, n)

    return task


@pytest.fixture
def retrying() -> Any:
    return _retrying()


@pytest.mark.parametrize(("step", "said"), [("args", "n=10"), ("kwargs", "n=20"),
                                            ("catch-max", "gave up at 2"), ("bare", "ok")])
def test_instant_retries_give_self_retry_the_worker_s_meaning(
        retrying: Any, step: str, said: str) -> None:
    with instant_retries():
        result = retrying.apply((step, 0))
    assert result.get() == said
    assert [attempt for attempt, _ in CALLS[result.id]] == [1, 2]
    record = get_job_record(result.id, app=retrying.app)
    assert record is not None
    if step == "bare":
        assert [e.type for e in record.errors] == ["ojs.retry_requested"]


def test_ret07_instant_retries_end_a_job_keeping_no_next_arguments() -> None:
    """``self.retry(exc=ValueError, args=...)`` with ValueError non-retryable, inside
    ``instant_retries()``: discarded as on a worker, and neither the record stored nor the
    one ``retries.record()`` gives holds the arguments of a call that never comes."""
    task = _retrying(non_retryable_errors=["ValueError"])
    with instant_retries() as retries:
        result = task.apply(("args-refused-by-policy", 0))
        built = retries.record(result.id)
    with pytest.raises(JobDiscarded) as info:
        result.get()
    stored = get_job_record(result.id, app=task.app)
    assert stored is not None and built is not None
    for record in (info.value.record, stored, built):
        assert (record.outcome, record.attempt) == ("discarded", 1)
        assert "next_call" not in record.extra
    assert len(CALLS[result.id]) == 1


def test_ret01_instant_retries_honour_max_retries(retrying: Any) -> None:
    with instant_retries():
        result = retrying.apply(("max-retries",))
    with pytest.raises(JobDiscarded) as info:
        result.get()
    assert (info.value.record.attempt, info.value.record.max_attempts) == (2, 2)


@pytest.mark.parametrize(("step", "raised"), [("max-retries", ValueError),
                                              ("refused", RetryRefused)])
def test_a_plain_eager_run_raises_what_celery_s_direct_call_raises(
        retrying: Any, step: str, raised: type[BaseException]) -> None:
    """Without ``instant_retries()`` the body runs once: ``exc`` is its error, as in a
    direct call, not an internal exception of the adapter; a refused option says so."""
    result = retrying.apply((step,))
    with pytest.raises(raised):
        result.get()
    assert len(CALLS[result.id]) == 1


def test_a_plain_eager_bare_retry_ends_in_celery_s_retry_state(retrying: Any) -> None:
    """``self.retry()`` with no exception, run once: Celery's ``Retry`` is its end (state
    RETRY, as a direct call raises it), and nothing runs again."""
    result = retrying.apply(("bare",))
    assert (result.state, type(result.result)) == ("RETRY", Retry)
    assert len(CALLS[result.id]) == 1


@pytest.mark.parametrize("hook", ["after_return", "on_failure"])
def test_instant_retries_refuse_self_retry_after_the_attempt(hook: str) -> None:
    """``self.retry()`` from ``after_return`` or ``on_failure`` inside ``instant_retries()``:
    ``RetryRefused``, as on a worker (Celery's eager run raises a hook's error from
    ``apply()``); not an internal request of the adapter; the body ran once."""
    app = Celery(f"eager-{uuid.uuid4().hex[:8]}", broker="memory://",
                 backend="cache+memory://", set_as_current=False)

    @app.task(shared=False, base=retry_steps.RetryingInHooks, bind=True, name="eager.hooked",
              retry_policy={"non_retryable_errors": ["ValueError"]})
    def hooked(self: Any, step: str) -> str:
        return retry_steps.hooked(self, step)

    task_id = str(uuid.uuid4())
    with instant_retries(), pytest.raises(RetryRefused):
        hooked.apply((hook,), task_id=task_id)
    assert HOOKED[task_id][0] == (hook, "RetryRefused")
    assert CALLS[task_id] == [(1, 0)]
