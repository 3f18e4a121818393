"""A twin of a retry that arrives after its attempt was dead-lettered in place runs nothing.

On a ``RedisBroker`` the dead letter replaces the stored body and fails the message
(``dramatiq_ext._dead_letter``), with no hop copy to claim. A second delivery of the same
retry copy (a delay-queue hop forwarded twice, a broker redelivery) then finds the record
dead-lettered at its attempt with its own copy's claim ("mine"). The record saved by the
in-place write is marked ``handed_off``, so that delivery is a duplicate (RET-14: one dead
letter per job), not a dead letter to publish again.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from dramatiq_ext._state import MessageState
from ojs_adapters.runtime import leases
from tests.dramatiq_ext.harness import make_env

POLICY = {"max_attempts": 2, "initial_interval": "PT0.05S", "jitter": False,
          "on_exhaustion": "dead_letter"}


@pytest.mark.broker
def test_a_twin_retry_after_an_in_place_dead_letter_is_dropped(
        redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The twin waits for the first delivery's lease, which lapses after LEASE_SECONDS once
    # that delivery is acked: 2 s here, so the twin is judged within the test.
    monkeypatch.setattr(leases, "LEASE_SECONDS", 2.0)
    runs: list[int] = []
    with make_env("redis", redis_url=redis_url) as env:
        real = env.ojs.publisher.publish_once

        def twice(broker: Any, message: Any, delay: Any, headers: Any) -> None:
            real(broker, message, delay, headers)
            if MessageState.of(message.options).attempt == 2:  # the retry, the same copy again
                real(broker, message, delay, headers)

        env.ojs.publisher.publish_once = twice  # type: ignore[method-assign]

        def always_fails() -> None:
            runs.append(1)
            raise RuntimeError("down")

        actor = env.actor(always_fails, retry_policy=POLICY)
        env.start(threads=1)  # the twin comes after its attempt ended
        message = actor.send()
        record = env.wait_record(message.message_id)
        dead = env.dead_letters(expect=1)
        time.sleep(4.0)  # the twin is judged meanwhile; a second dead letter would be here
        dead = env.dead_letters(expect=1, timeout=0.5)

    assert (record.state, record.dead_lettered, record.attempt) == ("discarded", True, 2)
    assert len(runs) == 2, "attempts 1 and 2 ran once each; the twin ran nothing"
    assert [m.message_id for m in dead] == [message.message_id], "one dead letter, not two"
    assert record.extra.get("handed_off") == "dead_letter"
