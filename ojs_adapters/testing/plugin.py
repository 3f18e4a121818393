"""The pytest plugin (entry point ``pytest11``) giving the fixture ``ojs_retries``.

Inert unless a test asks for the fixture: loading it imports no framework and
changes nothing.

    def test_declined_card_dead_letters(ojs_retries):
        ojs_retries.jitter_sample = 0.5          # optional: exact countdowns
        result = charge.delay(7)
        assert ojs_retries.countdowns(result.id) == [1.0, 2.0]
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ojs_adapters.testing import RetryRecorder, instant_retries


@pytest.fixture
def ojs_retries() -> Iterator[RetryRecorder]:
    """Instant OJS retries for the test, every decision recorded (``instant_retries()``)."""
    with instant_retries() as retries:
        yield retries
