"""Hand-crafted hostile ``options["ojs"]`` on a real Dramatiq worker (StubBroker, Redis and
RabbitMQ, issue 8).

The messages are put on the queue as a foreign producer would (no ``before_enqueue``
validation). Each ends as ``dramatiq_ext._state`` documents: an unreadable state or
attempt is dead-lettered unrun with an ``INVALID_PAYLOAD`` entry; a huge history,
a 10 MB message, junk entries, wrong types and an invalid ``retry_policy`` option
are bounded or ignored and the job runs; the worker keeps serving plain jobs.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
from dramatiq.message import Message

from ojs_adapters.history import MAX_DECODED_ENTRIES
from tests.dramatiq_ext.conftest import open_env
from tests.dramatiq_ext.harness import Env

HUGE_HISTORY = [{"attempt": i, "code": "HANDLER_ERROR", "type": "E", "message": "m"}
                for i in range(1, 100_001)]
HUGE_HISTORY[-1]["message"] = "x" * 10_000_000

#: name -> message options (``ojs`` and maybe ``retry_policy``)
INVALID: dict[str, dict[str, Any]] = {
    "not-an-object": {"ojs": "attempt 2"},
    "a-list": {"ojs": [1, 2]},
    "attempt-text": {"ojs": {"attempt": "2"}},
    "attempt-negative": {"ojs": {"attempt": -1}},
    "attempt-huge": {"ojs": {"attempt": 10**30}},
    "attempt-bool": {"ojs": {"attempt": True}},
}
BOUNDED: dict[str, dict[str, Any]] = {
    "huge-history": {"ojs": {"attempt": 2, "errors": HUGE_HISTORY}},
    "junk-entries": {"ojs": {"attempt": 1, "errors": [1, "x", None, {"code": "X"},
                             {"attempt": 1, "code": "HANDLER_ERROR", "message": "old"}]}},
    "wrong-types": {"ojs": {"attempt": 2, "errors": "x", "dead_letter": "yes",
                            "replay_count": "many", "last_replayed_at": 5}},
    "invalid-policy": {"retry_policy": {"max_attempts": -1, "backoff_strategy": "boom"}},
    "policy-not-object": {"retry_policy": "always retry"},
}
#: Whose body fails every time (to show which policy applied).
FAILING = {"invalid-policy", "policy-not-object"}


@pytest.fixture(params=["stub", "redis", "rabbitmq"])
def env(request: pytest.FixtureRequest) -> Iterator[Env]:
    yield from open_env(request, request.param)


def put_raw(env: Env, message: Message[Any]) -> None:
    """Put ``message`` on its queue as a foreign producer would: no ``enqueue`` hooks,
    so no ``before_enqueue`` validation."""
    if env.kind == "stub":
        env.broker.queues[env.queue].put(message.encode())
    elif env.kind == "redis":
        redis_id = str(uuid.uuid4())
        message = message.copy(options={"redis_message_id": redis_id})
        env.broker.do_enqueue(env.queue, redis_id, message.encode())
    else:
        import pika

        env.broker.declare_queue(env.queue, ensure=True)
        env.broker.channel.basic_publish(exchange="", routing_key=env.queue,
                                         body=message.encode(),
                                         properties=pika.BasicProperties(delivery_mode=2))


def test_hostile_options_end_as_documented_and_the_worker_moves_on(env: Env) -> None:
    runs: dict[str, list[int]] = defaultdict(list)

    def job(name: str) -> None:
        runs[name].append(1)
        if name in FAILING:
            raise ValueError(name)

    actor = env.actor(job, retry_policy={"max_attempts": 3, "initial_interval": "PT0.01S",
                                         "jitter": False})
    sent = {}
    for name, options in {**INVALID, **BOUNDED}.items():
        message = actor.message(name).copy(options=options)
        put_raw(env, message)
        sent[name] = message.message_id
    plain = actor.send("plain").message_id
    env.start()

    for name in INVALID:
        record = env.wait_record(sent[name])
        assert (record.outcome, record.dead_lettered) == ("dead_letter", True), name
        assert record.errors[-1].code == "INVALID_PAYLOAD", name
        assert name not in runs, name
    letters = env.dead_letters(expect=len(INVALID))
    assert sorted(m.message_id for m in letters) == sorted(sent[n] for n in INVALID)
    for letter in letters:
        assert letter.options["ojs"]["errors"][-1]["code"] == "INVALID_PAYLOAD"

    huge = env.wait_record(sent["huge-history"])
    assert (huge.outcome, huge.attempt) == ("completed", 2)
    assert [e.attempt for e in huge.errors] == list(
        range(100_001 - MAX_DECODED_ENTRIES, 100_001))
    assert len(huge.errors[-1].message) < 2100
    junk = env.wait_record(sent["junk-entries"])
    assert junk.outcome == "completed" and [e.message for e in junk.errors] == ["old"]
    wrong = env.wait_record(sent["wrong-types"])
    assert (wrong.outcome, wrong.attempt) == ("completed", 2)
    for name in FAILING:  # the actor's policy applies: three runs, then discarded
        record = env.wait_record(sent[name])
        assert (record.outcome, record.attempt, len(runs[name])) == ("discarded", 3, 3), name
    assert env.wait_record(plain).outcome == "completed"
