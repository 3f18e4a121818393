"""What a Dramatiq worker logs under ``OjsRetries`` (docs/operations/observability.md).

Dramatiq's ``Retries`` lines ("Retrying message ...", "Retries exceeded ...") give way
to one ``ojs_adapters.retry`` record per decision (R-9) and ``OjsRetries``' own lines;
the hop that fails a dead letter into ``.XQ`` is no "Message ... was skipped" WARNING,
on real workers on Redis and RabbitMQ. A skip of the user's own still warns.
"""

from __future__ import annotations

import logging
import time

import pytest
from dramatiq.middleware import SkipMessage

from tests.dramatiq_ext.harness import Env, flaky

FAST = {"initial_interval": "PT0.02S", "jitter": False}


def _lines(caplog: pytest.LogCaptureFixture, logger: str) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == logger]


@pytest.mark.parametrize("env", ["redis", "rabbitmq"], indirect=True)
def test_r9_decision_records_replace_dramatiqs_retry_lines_and_the_hop_is_quiet(
        env: Env, caplog: pytest.LogCaptureFixture) -> None:
    actor = env.actor(flaky(99, []), retry_policy={**FAST, "max_attempts": 2,
                                                   "on_exhaustion": "dead_letter"})
    with caplog.at_level(logging.DEBUG):
        env.start()
        message = actor.send()
        env.wait_record(message.message_id)
        env.dead_letters(expect=1)
        time.sleep(0.2)  # the hop's after-hooks and nack, on RabbitMQ
    assert _lines(caplog, "dramatiq.middleware.retries.Retries") == []
    decisions = _lines(caplog, "ojs_adapters.retry")
    assert [(level, "decision=retry" in text, "decision=dead_letter" in text)
            for level, text in decisions] == [(logging.INFO, True, False),
                                              (logging.WARNING, False, True)]
    ours = _lines(caplog, "dramatiq_ext.middleware.OjsRetries")
    assert [level for level, text in ours if "dead-lettered to" in text] == [logging.INFO]
    assert not [r for r in caplog.records if "was skipped" in r.getMessage()]


def test_a_skip_of_the_users_own_still_warns(env: Env,
                                             caplog: pytest.LogCaptureFixture) -> None:
    def job() -> None:
        raise SkipMessage("not today")

    actor = env.actor(job)
    with caplog.at_level(logging.WARNING):
        env.start()
        message = actor.send()
        env.wait_record(message.message_id)
        time.sleep(0.1)
    assert [r.levelno for r in caplog.records if "was skipped" in r.getMessage()] == [
        logging.WARNING]
