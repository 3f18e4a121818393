"""Testing your own tasks' retries: instant, recorded, with the production decisions.

``instant_retries()`` makes every retry of an ``OjsTask`` (Celery, eager mode) or an
``OjsRetries`` actor (Dramatiq, e.g. ``StubBroker`` and a ``Worker``) run at once,
and records every decision, so a test of a job that would back off for minutes runs
in milliseconds::

    from ojs_adapters.testing import instant_retries

    with instant_retries(jitter_sample=0.5) as retries:   # 0.5: jitter-free delays
        result = charge.delay(7)                          # Celery, task_always_eager
    retries.attempts(result.id)      # 3
    retries.countdowns(result.id)    # [1.0, 2.0]: what a worker would wait
    retries.outcome(result.id)       # "dead_letter"
    retries.record(result.id)        # the JobRecord a worker would store

The decision is ``ojs_adapters.decide`` and the record the adapter's own, as in
production; only the waiting is skipped. The pytest fixture ``ojs_retries`` (loaded
automatically, inert unless a test names it) is the same recorder. See
``docs/testing.md`` for what is and is not simulated.
"""

from ojs_adapters.testing._recorder import RetryRecorder


def instant_retries(*, jitter_sample: float | None = None) -> RetryRecorder:
    """A recorder to use as a context manager: retries are instant inside its block.

    ``jitter_sample`` (u in [0, 1)) pins the jitter of every decision taken inside,
    for exact countdowns (0.5: multiplier 1.0); ``None`` draws it as configured.
    It can also be set later: ``retries.jitter_sample = 0.5``.

    >>> with instant_retries(jitter_sample=0.5) as retries:
    ...     pass
    >>> retries.jobs()
    []
    """
    return RetryRecorder(jitter_sample=jitter_sample)


__all__ = ["RetryRecorder", "instant_retries"]
