"""Issue 17: a successor that cannot be published for a reason other than the broker.

Trying again cannot help (the message cannot be encoded, a hook refuses it), and the
broker is not down, so holding the ack would hold it for ever. Both frameworks make
it a decided, recorded and reported outcome, never a lost job nor a record left
saying ``retryable``:

- **the retry**: decided again, as a dead letter (``handler_code`` ``DEAD_LETTER`` on an
  ``INVALID_PAYLOAD`` entry naming the publish failure, whatever ``on_exhaustion`` says:
  a person must look at it, RET-17), the record ``dead_lettered`` with the history of
  both (RET-14), one decision event (the dead letter; the retry never happened), and the
  job on its dead-letter queue. Attempt 1 runs once and no attempt 2 ever runs (RET-01).
- **the dead letter itself**: the original goes to the dead-letter queue as it came
  (its record keeps the history), once: no requeue loop, one decision event.

The cause of the first: the job's body put something that is not JSON into its own
(mutable) argument, then failed; both frameworks re-encode the arguments for the retry.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from dramatiq.middleware import Middleware, MiddlewareError

from ojs_adapters import JobError
from tests.lifecycle.lanes import open_lane, wait_until

#: The retry would run 100 ms after the failure: long enough to see it never does.
POLICY = {"max_attempts": 3, "initial_interval": "PT0.1S", "jitter": False}


def _poisons_its_payload_then_fails(payload: dict[str, Any], attempt: int) -> None:
    payload["connection"] = object()  # a live handle: no serializer can send it on
    raise ValueError(f"lookup failed on attempt {attempt}")


@pytest.mark.broker
def test_ret17_a_retry_that_cannot_be_encoded_is_dead_lettered_recorded_and_reported(
        lane_kind: tuple[str, str]) -> None:
    with open_lane(*lane_kind) as lane:
        job = lane.declare(_poisons_its_payload_then_fails, policy=POLICY)
        lane.start()
        job_id = lane.send(job, {"order": 7})

        record = lane.wait_record(job_id, lambda r: r.state == "discarded")
        dead = lane.dead_letter_ids(expect=1, timeout=15)
        time.sleep(1.0)  # a retry (due after 100 ms), were one published, would run now
        dead += lane.dead_letter_ids(expect=1, timeout=0.5)
        events = lane.events_of(job_id)
        errors = lane.logs.lines(lane.name_of(job), job_id, "could not be published")
        runs = list(lane.runs[job_id])

    print(f"\n{lane.framework} {lane.kind}: runs {runs}, record {record.state}/"
          f"{record.outcome}, entries {[(e.code, e.type) for e in record.errors]}, "
          f"events {[e.decision.action for e in events]}, dead letters {dead}")
    assert runs == [1], "attempt 1 runs once, and no retry of it ever runs"
    assert (record.state, record.outcome, record.dead_lettered, record.attempt) == (
        "discarded", "dead_letter", True, 1)
    handler, publish = record.errors
    assert (handler.attempt, handler.code, handler.type, handler.handler_code) == (
        1, "HANDLER_ERROR", "ValueError", None)
    assert (publish.attempt, publish.code, publish.type, publish.handler_code) == (
        1, "INVALID_PAYLOAD", "ojs.successor_unpublishable", "DEAD_LETTER")
    assert publish.message == ("the retry could not be published: TypeError: "
                               "Object of type object is not JSON serializable")
    assert dict(publish.details or {}) == {"successor": "retry", "cause": "TypeError"}
    assert [(e.decision.action, e.decision.reason, e.decision.entry.code) for e in events] \
        == [("dead_letter", "handler_code", "INVALID_PAYLOAD")], "one decision, reported once"
    assert dead == [job_id], "the job is on its dead-letter queue, once"
    assert errors, "an ERROR line names the task and the publish failure"


class RefuseDeadLetters(Middleware):
    """A Dramatiq middleware that refuses every dead-letter hop (Dramatiq lets only a
    ``MiddlewareError`` out of a ``before_enqueue``; any other it logs and ignores)."""

    def before_enqueue(self, broker: Any, message: Any, delay: Any) -> None:
        if (message.options.get("ojs") or {}).get("dead_letter"):
            raise MiddlewareError("dead letters are refused by policy")


@pytest.mark.broker
def test_ret17_a_dead_letter_that_cannot_be_published_goes_as_it_came_once(
        lane_kind: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Dramatiq: another middleware refuses the dead-letter hop. Celery publishes the dead
    letter itself (kombu has no publish hooks): its publish raises the same error."""
    framework, kind = lane_kind
    if framework == "celery":
        import celery_ext._request as request_module

        def refuse(*args: Any, **kwargs: Any) -> None:
            raise ValueError("dead letters are refused by policy")

        monkeypatch.setattr(request_module, "publish_dead_letter", refuse)
    middleware = [RefuseDeadLetters()] if framework == "dramatiq" else []
    if framework == "dramatiq" and kind == "redis":
        # A RedisBroker's dead letter is written in place, with nothing to publish
        # (``_dead_letter``); the hop this test refuses is the way when that fails.
        import dramatiq_ext._outcome as outcome_module

        monkeypatch.setattr(outcome_module, "dead_letter_in_place",
                            lambda *args, **kwargs: None)

    def card_stolen(payload: dict[str, Any], attempt: int) -> None:
        raise JobError("payment.card_stolen", "stolen card", code="DEAD_LETTER")

    with open_lane(framework, kind, middleware=middleware) as lane:
        job = lane.declare(card_stolen, policy=POLICY)
        lane.start()
        job_id = lane.send(job, {"order": 8})

        record = lane.wait_record(job_id, lambda r: r.state == "discarded")
        dead = lane.dead_letter_ids(expect=1, timeout=15)
        time.sleep(1.0)  # a requeued original would be delivered (and published) again now
        dead += lane.dead_letter_ids(expect=1, timeout=0.5)
        refused = wait_until(lambda: lane.logs.lines(
            lane.name_of(job), job_id, "dead-lettering the original as it came"),
            timeout=5, what="the fallback is logged")
        events = lane.events_of(job_id)
        runs = list(lane.runs[job_id])

    print(f"\n{lane.framework} {lane.kind}: runs {runs}, record {record.outcome}, "
          f"events {[e.decision.action for e in events]}, dead letters {dead}, "
          f"logged {len(refused)}x")
    assert runs == [1]
    assert (record.outcome, record.dead_lettered) == ("dead_letter", True)
    assert [(e.code, e.type, e.handler_code) for e in record.errors] == [
        ("HANDLER_ERROR", "payment.card_stolen", "DEAD_LETTER")]
    assert [e.decision.action for e in events] == ["dead_letter"]
    assert dead == [job_id], "the original is on the dead-letter queue, once"
    assert len(refused) == 1, "handled once: no redelivery loop"
