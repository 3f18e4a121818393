"""``instant_retries()`` and the ``ojs_retries`` fixture, for Celery (eager) and Dramatiq
(``StubBroker`` and a ``Worker``), through the public API only.

Every policy here asks for minutes of backoff; the file runs in well under a second or
two, and says how long at its end (measured and printed, never asserted: DESIGN.md).
"""

from __future__ import annotations

import logging
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import dramatiq
import pytest
from celery import Celery
from dramatiq.brokers.stub import StubBroker

from celery_ext import JobDeadLettered, JobDiscarded, OjsTask
from dramatiq_ext import OjsRetries
from ojs_adapters import JobError, OjsValidationError, RetryPolicy, RetryPolicyDict
from ojs_adapters.testing import RetryRecorder, instant_retries

#: Seconds of backoff the policies of this file asked for, and when it started.
CLOCK: dict[str, float] = {"backoff": 0.0, "started": 0.0}

#: A retryable failure, then success: the job of the issue's first example.
PAYMENT_DECLINED = JobError("payment.card_declined", "insufficient funds")


@pytest.fixture(scope="module", autouse=True)
def wall_time(pytestconfig: pytest.Config) -> Iterator[None]:
    """Print the file's wall time and the backoff it skipped (not asserted)."""
    CLOCK["started"] = time.perf_counter()
    yield
    elapsed = time.perf_counter() - CLOCK["started"]
    line = (f"tests/testing/test_instant_retries.py: {elapsed:.2f} s of wall time; the "
            f"policies asked for {CLOCK['backoff'] / 60:.0f} min of backoff")
    capture = pytestconfig.pluginmanager.get_plugin("capturemanager")
    if capture is None:  # pragma: no cover - run with -p no:capture
        print(f"\n{line}")
        return
    with capture.global_and_fixture_disabled():  # what capsys.disabled() does
        print(f"\n{line}")


def waited(retries: RetryRecorder, job_id: str) -> list[float]:
    """``retries.countdowns(job_id)``, added to the backoff this file skipped."""
    countdowns = retries.countdowns(job_id)
    CLOCK["backoff"] += sum(countdowns)
    return countdowns


def flaky(failures: int, error: BaseException = PAYMENT_DECLINED) -> Callable[..., str]:
    """A job body that raises ``error`` ``failures`` times, then returns ``"charged"``."""
    calls: list[int] = []

    def charge(order_id: int) -> str:
        calls.append(order_id)
        if len(calls) <= failures:
            raise error
        return "charged"

    return charge


class CeleryJobs:
    """Tasks of an eager Celery app (the usual test setting), results in memory."""

    framework = "celery"

    def __init__(self) -> None:
        self.app = Celery(f"instant-{uuid.uuid4().hex[:8]}", broker="memory://",
                          backend="cache+memory://", set_as_current=False)
        self.app.conf.task_always_eager = True
        self.results: dict[str, Any] = {}

    def define(self, body: Callable[..., Any], retry_policy: RetryPolicyDict,
               **options: Any) -> Any:
        return self.app.task(body, shared=False, base=OjsTask, retry_policy=retry_policy,
                             name=f"shop.{body.__name__}.{uuid.uuid4().hex[:6]}", **options)

    def run(self, task: Any, *args: Any) -> str:
        """Send the job and return its id once it ended (eager: in the call)."""
        result = task.delay(*args)
        self.results[result.id] = result
        return str(result.id)

    def close(self) -> None:
        pass


class DramatiqJobs:
    """Actors on a ``StubBroker`` with ``OjsRetries``, run by an in-process ``Worker``."""

    framework = "dramatiq"

    def __init__(self) -> None:
        self.broker = StubBroker()
        self.broker.add_middleware(OjsRetries())
        self.queue = f"instant-{uuid.uuid4().hex[:8]}"
        self.worker = dramatiq.Worker(self.broker, worker_timeout=20, worker_threads=1)
        self.worker.start()

    def define(self, body: Callable[..., Any], retry_policy: RetryPolicyDict,
               **options: Any) -> Any:
        return dramatiq.actor(body, broker=self.broker, queue_name=self.queue,
                              actor_name=f"{body.__name__}_{uuid.uuid4().hex[:6]}",
                              retry_policy=retry_policy, **options)

    def run(self, actor: Any, *args: Any) -> str:
        """Send the job and return its id once it ended (all its retries included)."""
        message = actor.send(*args)
        self.broker.join(self.queue, fail_fast=False, timeout=10_000)
        self.worker.join()
        return str(message.message_id)

    def close(self) -> None:
        self.worker.stop()
        self.broker.close()


@pytest.fixture(params=["celery", "dramatiq"])
def jobs(request: pytest.FixtureRequest) -> Iterator[CeleryJobs | DramatiqJobs]:
    """The same jobs on each framework."""
    made = CeleryJobs() if request.param == "celery" else DramatiqJobs()
    yield made
    made.close()


def test_each_block_counts_its_own_retry_budget(jobs: CeleryJobs | DramatiqJobs) -> None:
    """A retry budget (R-7) lasts one block, in memory: the next test starts from zero
    whatever ran before it, and none writes its counts to a shared Redis."""
    policy: RetryPolicyDict = {"max_attempts": 3, "initial_interval": "PT1M"}
    for _ in range(3):  # three tests in a row, each with the same dependency
        task = jobs.define(flaky(2), policy, retry_budget="payments-api")
        with instant_retries(jitter_sample=0.5) as retries:
            job_id = jobs.run(task, 7)
            assert (retries.attempts(job_id), retries.outcome(job_id)) == (3, "completed")


def test_a_first_try_success_is_seen_on_any_broker(jobs: CeleryJobs | DramatiqJobs) -> None:
    """A job that never failed is in ``jobs()`` and reads as completed, on a broker that
    is not Dramatiq's global one too."""
    task = jobs.define(flaky(0), {"max_attempts": 3})
    with instant_retries() as retries:
        job_id = jobs.run(task, 7)
    assert retries.jobs() == [job_id]
    assert (retries.attempts(job_id), retries.outcome(job_id)) == (1, "completed")


def test_celery_eager_with_a_result_backend_that_does_not_answer(
        caplog: pytest.LogCaptureFixture) -> None:
    """The production app in a test (a Redis result backend, down): the block says so
    once and keeps the records in memory, instead of waiting out the backend's retries
    on every save and then raising from ``attempts()``."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]  # nothing listens there once closed
    app = Celery(f"instant-{uuid.uuid4().hex[:8]}", broker="memory://",
                 backend=f"redis://127.0.0.1:{port}/0", set_as_current=False)
    app.conf.task_always_eager = True
    task = app.task(flaky(9), shared=False, base=OjsTask, name="shop.down",
                    retry_policy={"max_attempts": 3, "initial_interval": "PT1M"})
    with instant_retries(jitter_sample=0.5) as retries:
        job_id = task.delay(7).id
    assert (retries.attempts(job_id), retries.outcome(job_id)) == (3, "discarded")
    assert retries.countdowns(job_id) == [60.0, 120.0]
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert sum("result backend does not answer" in m for m in said) == 1, said
    assert not any("cannot store the job record" in m for m in said)


def test_a_block_inside_another_is_the_same_test(jobs: CeleryJobs | DramatiqJobs) -> None:
    """The ``ojs_retries`` fixture and a ``with`` in the test are one test: one count of
    each retry budget, and the workers' budgets (their gauge) untouched."""
    from ojs_adapters.runtime.budget import BUDGETS_REGISTRY

    policy: RetryPolicyDict = {"max_attempts": 3, "initial_interval": "PT1M"}
    with instant_retries(jitter_sample=0.5) as outer:
        first = jobs.run(jobs.define(flaky(2), policy, retry_budget="search"), 1)
        with instant_retries(jitter_sample=0.5) as inner:
            second = jobs.run(jobs.define(flaky(2), policy, retry_budget="search"), 2)
            assert not any(b._in_block for b in BUDGETS_REGISTRY)  # no gauge of a copy
    assert outer.attempts(first) == 3
    # The inner block counts on from the outer one's two retries: its job, which a block
    # of its own retries twice (test_each_block_counts_its_own_retry_budget), is refused.
    assert inner.attempts(second) < 3 and inner.decisions(second)[-1].reason == "budget"


def test_celery_eager_with_a_backend_that_fails_a_write(monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture
                                                        ) -> None:
    """A backend that answers and stores the first record, then fails: the records read
    are the run's, not the first one stored, in the block and in one inside it."""
    made = CeleryJobs()
    stored: list[str] = []
    real_set = made.app.backend.set

    def set_once(key: Any, value: Any) -> Any:
        stored.append(key)
        if len(stored) > 1:
            raise OSError("disk full")
        return real_set(key, value)

    monkeypatch.setattr(made.app.backend, "set", set_once)
    task = made.define(flaky(9), {"max_attempts": 3, "initial_interval": "PT1M"})
    with instant_retries(jitter_sample=0.5) as outer, \
            instant_retries(jitter_sample=0.5) as inner:
        job_id = made.run(task, 7)
    for retries in (outer, inner):
        assert (retries.attempts(job_id), retries.outcome(job_id)) == (3, "discarded")
    said = [r.getMessage() for r in caplog.records if "cannot store" in r.getMessage()]
    assert len(said) == 1 and len(stored) == 2  # written off after the failed write


def test_ret11_fails_twice_then_succeeds_with_the_policys_countdowns(
        jobs: CeleryJobs | DramatiqJobs) -> None:
    policy: RetryPolicyDict = {"max_attempts": 5, "initial_interval": "PT1M"}
    charge = jobs.define(flaky(2), policy)
    with instant_retries(jitter_sample=0.5) as retries:  # u = 0.5: multiplier 1.0
        job = jobs.run(charge, 7)
    assert retries.attempts(job) == 3
    assert waited(retries, job) == RetryPolicy.from_dict(policy).schedule()[:2] == [60.0, 120.0]
    assert retries.outcome(job) == "completed"
    record = retries.record(job)
    assert record is not None and record.state == "completed" and record.attempt == 3
    assert [e.type for e in record.errors] == ["payment.card_declined"] * 2
    assert record.extra["countdowns"] == [60.0, 120.0]  # the record keeps the real delays


@pytest.mark.parametrize(("on_exhaustion", "outcome"), [("discard", "discarded"),
                                                         ("dead_letter", "dead_letter")])
def test_ret07_non_retryable_error_ends_at_attempt_1(
        jobs: CeleryJobs | DramatiqJobs, on_exhaustion: Any, outcome: str) -> None:
    stolen = JobError("payment.card_stolen", "reported stolen")
    charge = jobs.define(flaky(9, stolen), {
        "max_attempts": 5, "initial_interval": "PT10M", "max_interval": "PT1H",
        "on_exhaustion": on_exhaustion,
        "non_retryable_errors": ["payment.card_stolen"]})
    with instant_retries() as retries:
        job = jobs.run(charge, 7)
    assert retries.attempts(job) == 1
    assert waited(retries, job) == []
    assert retries.outcome(job) == outcome
    record = retries.record(job)
    assert record is not None and record.dead_lettered is (outcome == "dead_letter")
    assert [e.code for e in record.errors] == ["NON_RETRYABLE_ERROR"]


def test_ret08_handler_dead_letter_code_dead_letters(jobs: CeleryJobs | DramatiqJobs) -> None:
    fraud = JobError("payment.fraud_suspected", "held for review", code="DEAD_LETTER")
    charge = jobs.define(flaky(9, fraud), {"max_attempts": 5, "initial_interval": "PT5M"})
    with instant_retries() as retries:
        job = jobs.run(charge, 7)
    assert (retries.attempts(job), retries.outcome(job), waited(retries, job)) == (
        1, "dead_letter", [])
    record = retries.record(job)
    assert record is not None and record.dead_lettered and record.state == "discarded"
    assert record.errors[0].handler_code == "DEAD_LETTER"


def test_ret01_ret17_exhausted_after_hours_of_backoff(jobs: CeleryJobs | DramatiqJobs) -> None:
    policy: RetryPolicyDict = {"max_attempts": 6, "initial_interval": "PT2M",
                               "max_interval": "PT1H", "backoff_coefficient": 3.0,
                               "on_exhaustion": "dead_letter"}
    charge = jobs.define(flaky(99), policy)
    with instant_retries(jitter_sample=0.5) as retries:
        job = jobs.run(charge, 7)
    assert retries.attempts(job) == 6
    assert waited(retries, job) == RetryPolicy.from_dict(policy).schedule() == [
        120.0, 360.0, 1080.0, 3240.0, 3600.0]
    assert retries.outcome(job) == "dead_letter"
    assert [d.action for d in retries.decisions(job)] == ["retry"] * 5 + ["dead_letter"]


def test_ret05_unpinned_jitter_is_recorded_as_decided(jobs: CeleryJobs | DramatiqJobs) -> None:
    policy: RetryPolicyDict = {"max_attempts": 4, "initial_interval": "PT30S"}
    charge = jobs.define(flaky(3), policy)
    with instant_retries() as retries:
        job = jobs.run(charge, 7)
    countdowns = waited(retries, job)
    bounds = [RetryPolicy.from_dict(policy).jitter_bounds(n) for n in (1, 2, 3)]
    assert all(low <= c <= high for c, (low, high) in zip(countdowns, bounds, strict=True))
    record = retries.record(job)
    assert record is not None and record.extra["countdowns"] == countdowns
    assert retries.outcome(job) == "completed" and retries.attempts(job) == 4


def test_fixture_ojs_retries_pins_jitter_when_asked(
        jobs: CeleryJobs | DramatiqJobs, ojs_retries: RetryRecorder) -> None:
    ojs_retries.jitter_sample = 0.5
    charge = jobs.define(flaky(1), {"initial_interval": "PT15M", "max_interval": "PT1H"})
    job = jobs.run(charge, 7)
    assert (ojs_retries.attempts(job), waited(ojs_retries, job),
            ojs_retries.outcome(job)) == (2, [900.0], "completed")
    assert ojs_retries.jobs() == [job]


def test_celery_eager_result_raises_as_a_worker_run_would() -> None:
    jobs = CeleryJobs()
    charge = jobs.define(flaky(99), {"max_attempts": 2, "initial_interval": "PT1H",
                                     "max_interval": "PT1H", "on_exhaustion": "dead_letter"})
    stolen = jobs.define(flaky(9, JobError("payment.card_stolen", "stolen", code="DISCARD")),
                         {"initial_interval": "PT1M"})
    with instant_retries(jitter_sample=0.5) as retries:
        dead, discarded = jobs.run(charge, 7), jobs.run(stolen, 8)
    CLOCK["backoff"] += 3600.0
    with pytest.raises(JobDeadLettered) as caught:
        jobs.results[dead].get()
    assert caught.value.record == retries.record(dead)
    assert caught.value.record.extra["dead_letter_queue"] == "celery.dead_letter"
    with pytest.raises(JobDiscarded) as ended:
        jobs.results[discarded].get()
    assert ended.value.outcome == retries.outcome(discarded) == "discarded"


def test_celery_eager_outside_the_block_runs_once_as_before() -> None:
    jobs = CeleryJobs()
    charge = jobs.define(flaky(1), {"initial_interval": "PT1M"})
    with instant_retries() as retries:
        pass
    job = jobs.run(charge, 7)
    assert isinstance(jobs.results[job].result, JobError)  # no retry: Celery's eager meaning
    assert retries.jobs() == [] and retries.record(job) is None


def test_dramatiq_dead_letter_reaches_the_stub_brokers_dead_letters() -> None:
    jobs = DramatiqJobs()
    try:
        charge = jobs.define(flaky(99), {"max_attempts": 3, "initial_interval": "PT20M",
                                         "max_interval": "PT1H", "on_exhaustion": "dead_letter"})
        with instant_retries(jitter_sample=0.5) as retries:
            job = jobs.run(charge, 7)
        assert waited(retries, job) == [1200.0, 2400.0]
        assert [m.message_id for m in jobs.broker.dead_letters] == [job]
        record = retries.record(job)
        assert record is not None and record.extra["delays_ms"] == [1_200_000, 2_400_000]
    finally:
        jobs.close()


def test_jitter_sample_is_checked() -> None:
    with pytest.raises(OjsValidationError, match="jitter_sample"):
        instant_retries(jitter_sample=1.0)


def test_celery_eager_honours_self_retry_and_per_call_policy() -> None:
    jobs = CeleryJobs()
    jobs.app.conf.task_eager_propagates = True  # the usual Django test setting

    @jobs.app.task(shared=False, base=OjsTask, bind=True, name="shop.poll",
                   retry_policy={"max_attempts": 5, "initial_interval": "PT1S"})
    def poll(self: Any, order_id: int) -> int:
        if self.ojs.attempt < 3:
            self.retry(exc=JobError("gateway.busy", "try later"), countdown=600)
        return int(self.ojs.attempt)

    with instant_retries(jitter_sample=0.5) as retries:
        done = poll.delay(7)
        with pytest.raises(JobDiscarded) as caught:  # propagated: raised by the call
            poll.apply_async((8,), retry_policy={"max_attempts": 2})
    ended = caught.value.record.id
    assert done.get() == 3 and waited(retries, done.id) == [600.0, 600.0]  # at least 600 s
    assert (retries.attempts(ended), retries.outcome(ended)) == (2, "discarded")
    assert retries.jobs() == [done.id, ended]


def test_celery_eager_ignore_ends_the_job_as_in_a_worker() -> None:
    """``Ignore`` from the handler on attempt 2: the record says the handler ended the job,
    as a worker's does, not the ``retryable`` of attempt 1 (nothing will retry it)."""
    from celery.exceptions import Ignore

    jobs = CeleryJobs()

    @jobs.app.task(shared=False, base=OjsTask, bind=True, name="shop.skip",
                   retry_policy={"max_attempts": 3, "initial_interval": "PT1M"})
    def skip(self: Any, order_id: int) -> None:
        if self.ojs.attempt == 1:
            raise PAYMENT_DECLINED
        raise Ignore()

    with instant_retries(jitter_sample=0.5) as retries:
        job = skip.delay(7).id
    CLOCK["backoff"] += 60.0
    record = retries.record(job)
    assert record is not None
    assert (record.state, record.attempt, record.extra["end_reason"]) == (
        "discarded", 2, "ended by the handler (Ignore)")
    assert [e.attempt for e in record.errors] == [1]
