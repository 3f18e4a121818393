"""Which task of a ``Task.replace`` replacement takes the job on (``_replace._id_holder``),
for each canvas Celery accepts: no broker, the signatures as ``Task.replace`` freezes them."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery, chain, chord, group

from celery_ext._replace import _id_holder


@pytest.fixture(scope="module")
def task() -> Any:
    app = Celery("ojs-replace-units", broker="memory://", backend="cache+memory://",
                 set_as_current=False)

    @app.task(shared=False, name="units.step")
    def step(n: int) -> int:
        return n

    return step


@pytest.mark.parametrize(("build", "holder"), [
    (lambda t: t.si(1), lambda sig: sig),
    (lambda t: chain(t.si(1), t.si(2)), lambda sig: sig.tasks[-1]),
    (lambda t: chord([t.si(1), t.si(2)], t.si(3)), lambda sig: sig.body),
    (lambda t: chord([t.si(1)], chain(t.si(2), t.si(3))), lambda sig: None),
], ids=["task", "chain", "chord", "chord-of-a-chain"])
def test_the_task_that_takes_the_jobs_id(task: Any, build: Any, holder: Any) -> None:
    sig = build(task)
    sig.freeze("job-1")  # as Task.replace does
    assert _id_holder(sig, "job-1") is holder(sig)


def test_a_group_goes_on_in_celerys_accumulate_not_a_task_of_ours(task: Any) -> None:
    sig = group([task.si(1), task.si(2)]) | task.app.tasks["celery.accumulate"].s(index=0)
    sig.freeze("job-1")
    found = _id_holder(sig, "job-1")
    assert found is not None and found.task == "celery.accumulate"
