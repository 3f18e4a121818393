"""Placement among Dramatiq's middleware, hook order, swallowed hook errors, Results, join.

StubBroker and a real in-process ``dramatiq.Worker``: these behaviours live in
Dramatiq's middleware machinery, which is the same for every broker.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import Middleware, MiddlewareError, Retries
from dramatiq.results import ResultFailure, Results
from dramatiq.results.backends import StubBackend

from dramatiq_ext import DeadLettered, MemoryRecordStore, OjsRetries, get_job_record
from dramatiq_ext.stores import ResultsRecordStore
from ojs_adapters.runtime.backend_retry import BackendRetry
from tests.dramatiq_ext.harness import TICK_MS, Env, dramatiq_defaults, flaky, make_env

FAST = {"initial_interval": "PT0.05S", "jitter": False}


class Probe(Middleware):
    """Notes the job-record state its ``after_process_message`` sees."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def after_process_message(self, broker: Any, message: Any, *, result: Any = None,
                              exception: BaseException | None = None) -> None:
        record = get_job_record(message.message_id, broker=broker)
        self.seen.append(record.state if record else "none")


def run(broker: Any, actor: Any, *, timeout: float = 10.0, **options: Any) -> Any:
    """Send one message, run a worker until its record is terminal; return the message."""
    worker = dramatiq.Worker(broker, worker_timeout=TICK_MS, worker_threads=1)
    worker.start()
    try:
        message = actor.send_with_options(**options)
        deadline = time.monotonic() + timeout
        while True:
            record = get_job_record(message.message_id, broker=broker)
            if record and record.state in ("completed", "discarded"):
                return message
            assert time.monotonic() < deadline, record
            time.sleep(0.02)
    finally:
        worker.stop(timeout=5000)


def test_replaces_dramatiq_retries_in_its_slot(caplog: pytest.LogCaptureFixture) -> None:
    broker = StubBroker(middleware=dramatiq_defaults())
    slot = next(i for i, m in enumerate(broker.middleware) if isinstance(m, Retries))
    ojs = OjsRetries()
    broker.add_middleware(ojs)
    with caplog.at_level(logging.DEBUG, logger="dramatiq_ext"):
        dramatiq.actor(lambda: None, actor_name="a", broker=broker)
    assert broker.middleware[slot] is ojs
    assert not any(isinstance(m, Retries) for m in broker.middleware)
    assert sum(m is ojs for m in broker.middleware) == 1
    # Dramatiq's default Retries: said at DEBUG only, not on every start (issue 16).
    [said] = [r for r in caplog.records if "replaced" in r.getMessage()]
    assert said.levelno == logging.DEBUG and "one retry engine" in said.getMessage()


def test_without_retries_nothing_moves(caplog: pytest.LogCaptureFixture) -> None:
    broker = StubBroker(middleware=[m for m in dramatiq_defaults()
                                    if not isinstance(m, Retries)])
    ojs = OjsRetries()
    broker.add_middleware(ojs)
    before = list(broker.middleware)
    with caplog.at_level(logging.WARNING):
        dramatiq.actor(lambda: None, actor_name="a", broker=broker)
    assert broker.middleware == before
    assert "replaced" not in caplog.text


def test_after_hooks_run_in_reverse_order_around_ojs_retries() -> None:
    """Middleware placed before OjsRetries see the decided record; those after, the old one."""
    early, late = Probe(), Probe()
    broker = StubBroker(middleware=[early, *dramatiq_defaults()], fail_fast_default=False)
    broker.add_middleware(OjsRetries())  # takes Retries' slot, after `early`
    broker.add_middleware(late)
    calls: list[float] = []
    actor = dramatiq.actor(flaky(1, calls), actor_name="once", broker=broker,
                           retry_policy=FAST)
    run(broker, actor)
    assert early.seen == ["retryable", "completed"]
    assert late.seen == ["active", "active"]


class BrokenStore(MemoryRecordStore):
    """A store whose writes fail, as a store on an unreachable server would."""

    def save(self, message_id: str, record: Any) -> None:
        raise ConnectionError("store down")


def test_a_failing_store_does_not_lose_the_retry() -> None:
    calls: list[float] = []
    with make_env("stub", ojs=OjsRetries(store=BrokenStore())) as env:
        actor = env.actor(flaky(1, calls), retry_policy=FAST)
        env.start()
        message = actor.send()
        deadline = time.monotonic() + 10
        while len(calls) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(calls) == 2
        assert [d for _m, d in env.log.retries(message.message_id)] == [50]


class RefuseRetries(Middleware):
    """Fails every re-enqueue, as a broker connection error would."""

    def before_enqueue(self, broker: Any, message: Any, delay: Any) -> None:
        if delay is not None:
            raise MiddlewareError("broker unreachable")


class FlakyBrokerRetries(Middleware):
    """Fails the first ``failures`` re-enqueues with a connection error, then lets them through."""

    def __init__(self, failures: int) -> None:
        self.failures = failures

    def before_enqueue(self, broker: Any, message: Any, delay: Any) -> None:
        if delay is not None and self.failures > 0:
            self.failures -= 1
            raise ConnectionError("broker unreachable")


def test_err016_a_retry_the_broker_refuses_for_a_while_is_held_not_dead_lettered() -> None:
    """5 tries in place, then the ack is held and the publish tried again until accepted."""
    calls: list[float] = []
    ojs = OjsRetries(jitter_source=lambda: 0.5, backend_retry=BackendRetry(sleep=lambda s: None))
    with make_env("stub", ojs=ojs, extra=[FlakyBrokerRetries(7)]) as env:
        actor = env.actor(flaky(1, calls), retry_policy=FAST)
        env.start()
        message = actor.send()
        record = env.wait_record(message.message_id, timeout=20)
        assert (record.state, record.attempt, len(calls)) == ("completed", 2, 2)
        assert env.dead_letters() == []


def test_a_retry_that_cannot_be_enqueued_is_dead_lettered_not_lost() -> None:
    """A non-broker error (a middleware refusing the message) cannot be retried away."""
    with make_env("stub", extra=[RefuseRetries()]) as env:
        actor = env.actor(lambda: 1 / 0, retry_policy=FAST)
        env.start()
        message = actor.send()
        [dead] = env.dead_letters(expect=1)
        assert dead.message_id == message.message_id


def test_stub_join_fail_fast_raises_dead_lettered(stub_env: Env) -> None:
    """The StubBroker trap: join(fail_fast=True) re-raises a dead-lettered message's error."""
    actor = stub_env.actor(lambda: 1 / 0, retry_policy={**FAST, "max_attempts": 1,
                                                        "on_exhaustion": "dead_letter"})
    worker = stub_env.start()
    actor.send()
    with pytest.raises(DeadLettered, match="division by zero") as raised:
        for _ in range(3):  # the hop to the dead-letter queue is a second delivery
            stub_env.broker.join(stub_env.queue, fail_fast=True)
            worker.join()
            time.sleep(0.05)
    assert type(raised.value).__name__ == "ZeroDivisionError"  # named as the actor's error
    assert raised.value.entry is not None and raised.value.entry.code == "HANDLER_ERROR"


def test_results_backend_holds_the_record_and_the_dead_letter_failure() -> None:
    backend = StubBackend()
    broker = StubBroker(middleware=dramatiq_defaults(), fail_fast_default=False)
    broker.add_middleware(Results(backend=backend))
    ojs = OjsRetries()
    broker.add_middleware(ojs)
    assert isinstance(ojs.store_for(broker), ResultsRecordStore)
    actor = dramatiq.actor(lambda: 1 / 0, actor_name="boom", broker=broker, store_results=True,
                           retry_policy={**FAST, "max_attempts": 2,
                                         "on_exhaustion": "dead_letter"})
    message = run(broker, actor)
    record = get_job_record(message.message_id, broker=broker)
    assert record is not None and record.dead_lettered and len(record.errors) == 2
    with pytest.raises(ResultFailure, match="actor raised ZeroDivisionError: division by zero"):
        message.get_result(backend=backend, block=True, timeout=5000)


def test_results_backend_stores_the_success_after_retries() -> None:
    backend = StubBackend()
    broker = StubBroker(middleware=dramatiq_defaults(), fail_fast_default=False)
    broker.add_middleware(Results(backend=backend))
    broker.add_middleware(OjsRetries())
    calls: list[float] = []
    actor = dramatiq.actor(flaky(1, calls, result=42), actor_name="once", broker=broker,
                           store_results=True, retry_policy=FAST)
    message = run(broker, actor)
    assert message.get_result(backend=backend, block=True, timeout=5000) == 42
    record = get_job_record(message.message_id, broker=broker)
    assert record is not None and [e.attempt for e in record.errors] == [1]


def test_worker_threads_racing_for_the_store_share_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each worker thread's first message asks for the store at once; all must get the same.

    Two ``MemoryRecordStore`` instances would split a job's record: the attempt-2
    thread would find no record and start a fresh one, losing attempt 1's history.
    """
    import threading

    import dramatiq_ext._settings as settings_module  # where OjsRetries resolves its store

    real = settings_module.default_store

    def slow_default_store(broker: Any, *, ttl: int) -> Any:
        time.sleep(0.05)  # e.g. the first import of dramatiq.brokers.redis
        return real(broker, ttl=ttl)

    monkeypatch.setattr(settings_module, "default_store", slow_default_store)
    ojs = OjsRetries()
    broker = StubBroker(middleware=[ojs])
    barrier = threading.Barrier(8)
    stores: list[Any] = []

    def first_message() -> None:
        barrier.wait()
        stores.append(ojs.store_for(broker))

    threads = [threading.Thread(target=first_message) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(stores) == 8 and all(store is stores[0] for store in stores)


def test_an_unreadable_record_counts_as_none_not_as_a_store_outage(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A stored record that cannot be decoded (a store without one-call admission) is taken
    as no record, as the one-call path takes it: the job runs. A store out of reach, not a
    bad record, is what makes admission wait and give the delivery back."""
    from ojs_adapters.runtime import admission

    monkeypatch.setattr(admission, "CLAIM_WAIT_SECONDS", 1.0)  # a wrong wait would show
    store = MemoryRecordStore()
    ojs = OjsRetries(store=store)
    with make_env("stub", ojs=ojs) as env:
        actor = env.actor(lambda: "done")
        message = actor.send()
        store.save(message.message_id, {"id": message.message_id,
                                        "errors": [{"attempt": "not a number"}]})
        env.start()
        deadline = time.monotonic() + 10
        while (store.load(message.message_id) or {}).get("state") != "completed":
            assert time.monotonic() < deadline, "the job never ran"
            time.sleep(0.02)
    assert (store.load(message.message_id) or {}).get("attempt") == 1
