"""The warnings, once per task and process, that an eager call skips the OJS policy.

``OjsTask`` warns on a task's first eager run (``task_always_eager`` or ``apply()``:
the body runs once, with no retries, countdowns or dead letter), and when
``instant_retries()`` sees a send to a real broker instead of an eager run.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("celery_ext")

#: Registry of the tasks whose eager use was already warned of (once per process).
EAGER_WARNED: set[str] = set()


def warn_eager_once(task_name: str) -> None:
    """Log, on the first eager call of ``task_name``, that eager mode skips the policy
    (and where to get it in a test: ``instant_retries()``)."""
    if task_name in EAGER_WARNED:
        return
    EAGER_WARNED.add(task_name)
    logger.warning("ojs-adapters: %s ran eagerly (task_always_eager or apply()): the body "
                   "runs once and its error is raised as is, with no retries, countdowns or "
                   "dead letter; send it to a worker to apply its OJS policy, or, in a test, "
                   "call it inside ojs_adapters.testing.instant_retries() (pytest fixture "
                   "ojs_retries) to apply the policy in place without waiting", task_name)


def warn_not_eager_once(task_name: str) -> None:
    """Log, once per task, that ``instant_retries()`` saw a send to a real broker."""
    key = f"not-eager:{task_name}"
    if key in EAGER_WARNED:
        return
    EAGER_WARNED.add(key)
    logger.warning("ojs-adapters: %s was sent to the broker inside instant_retries(), which "
                   "records eager runs only: set task_always_eager = True (and a result "
                   "backend such as cache+memory://) in your test settings", task_name)
