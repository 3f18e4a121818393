"""What a newcomer meets first on Celery (issue 16): native parity and no silent degradation.

- A ``retry_policy`` dict of only Celery's publish-retry keys keeps Celery's meaning and
  reaches kombu; mixing those keys with OJS keys is refused, naming the field.
- ``Celery(task_cls=OjsTask)`` makes every user task an OjsTask, while Celery's own
  tasks (``celery.chain``, ``celery.group``, ...) keep their native behaviour.
- A worker started with ``celery -A app worker`` names, once, each task whose OJS
  options do nothing (not an OjsTask) and a result backend without leases or claims.
- Eager mode says, at the first eager call of each task, that the policy is skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery, chain, group, signals
from celery.contrib.testing.worker import start_worker

from celery_ext import OjsTask
from celery_ext._checks import EAGER_WARNED
from celery_ext._headers import HEADER, HeaderState
from ojs_adapters import OjsValidationError
from tests.celery_ext.support import broker_named
from tests.quickstart.support import Worker

pytestmark = pytest.mark.broker


@pytest.fixture
def redis_app(redis_url: str) -> Iterator[tuple[Celery, Any]]:
    broker = broker_named("redis")
    app = broker.make_app("first-contact")
    try:
        yield app, broker
    finally:
        broker.cleanup(app)


def _published(app: Celery, send: Any) -> dict[str, Any]:
    """Publish with ``send()`` on the real broker; what Celery handed kombu."""
    seen: dict[str, Any] = {}

    def capture(sender: Any = None, headers: Any = None, retry_policy: Any = None,
                **_: Any) -> None:
        seen.update(headers=headers, retry_policy=retry_policy)

    signals.before_task_publish.connect(capture, weak=False)
    try:
        send()
    finally:
        signals.before_task_publish.disconnect(capture)
    return seen


def test_publish_retry_dict_reaches_kombu(redis_app: tuple[Celery, Any]) -> None:
    """Celery's own ``retry_policy={"max_retries": ...}`` on an OjsTask is kombu's, as natively."""
    app, broker = redis_app

    @app.task(shared=False, base=OjsTask, retry_policy={"max_attempts": 4},
              name="first-contact.publish")
    def job() -> None: ...

    queue = broker.queue_name("publish")
    seen = _published(app, lambda: job.apply_async(
        queue=queue, retry_policy={"max_retries": 1, "interval_start": 0.25}))
    assert seen["retry_policy"]["max_retries"] == 1
    assert seen["retry_policy"]["interval_start"] == 0.25
    state = HeaderState.from_headers(seen["headers"])
    assert state.policy is None  # the OJS policy is the task's, untouched
    assert job.policy().max_attempts == 4

    seen = _published(app, lambda: job.apply_async(
        queue=queue, publish_retry_policy={"max_retries": 2}))
    assert seen["retry_policy"]["max_retries"] == 2


def test_mixed_publish_and_ojs_keys_are_refused(redis_app: tuple[Celery, Any]) -> None:
    app, _ = redis_app

    @app.task(shared=False, base=OjsTask, name="first-contact.mixed")
    def job() -> None: ...

    with pytest.raises(OjsValidationError) as caught:
        job.apply_async(retry_policy={"max_attempts": 2, "interval_start": 1})
    assert caught.value.code == "INVALID_RETRY_POLICY"
    assert caught.value.details["field"] == "retry_policy.interval_start"


def test_task_cls_keeps_celery_builtins_native(redis_app: tuple[Celery, Any]) -> None:
    """With ``task_cls=OjsTask`` a chain and a group run on a real worker as natively."""
    _, broker = redis_app
    app = Celery("task-cls", broker=broker.url, backend=broker.backend, task_cls=OjsTask,
                 set_as_current=False)
    queue = broker.queue_name("canvas")
    app.conf.update(broker_transport_options=broker.transport_options(),
                    result_backend_transport_options={"global_keyprefix": broker.prefix + ":"},
                    task_default_queue=queue)

    @app.task(shared=False, name="first-contact.add")
    def add(x: int, y: int) -> int:
        return x + y

    assert isinstance(add, OjsTask) and not add.native
    assert all(t.native for name, t in app.tasks.items() if name.startswith("celery."))
    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False,
                      queues=[queue], loglevel="WARNING", shutdown_timeout=30):
        assert chain(add.s(1, 2), add.s(3)).delay().get(timeout=20) == 6
        assert group(add.s(i, i) for i in range(3)).delay().get(timeout=20) == [0, 2, 4]
    broker.cleanup(app)


WARN_APP = '''
from celery import Celery
from celery_ext import OjsTask

app = Celery("warnapp", broker="{broker}", backend="{backend}")

@app.task(retry_policy={{"max_attempts": 3}})
def plain():
    pass

@app.task(base=OjsTask)
def ojs():
    pass
'''


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "says"), [
    ("cache+memory://", "keeps job records but no leases or attempt claims"),
    ("rpc://", "stores no job record"),
])
def test_worker_start_names_what_is_off(tmp_path: Path, redis_url: str, backend: str,
                                        says: str) -> None:
    """``celery -A warnapp worker`` warns once of the ignored policy and the weaker backend."""
    (tmp_path / "warnapp.py").write_text(WARN_APP.format(broker=redis_url, backend=backend))
    worker = Worker(["celery", "-A", "warnapp", "worker", "--pool=solo", "--loglevel=INFO"],
                    tmp_path, "celery-redis", "ready.")
    worker.stop()
    ignored = [line for line in worker.lines if "warnapp.plain: retry_policy ignored" in line]
    assert len(ignored) == 1, worker.output
    assert "task_cls=OjsTask" in ignored[0] and "base=OjsTask" in ignored[0]
    assert sum(says in line for line in worker.lines) == 1, worker.output
    warnings = [line for line in worker.lines if "ojs-adapters:" in line]
    assert not [line for line in warnings if "warnapp.ojs" in line], worker.output


def test_eager_call_warns_once_per_task(caplog: pytest.LogCaptureFixture) -> None:
    app = Celery("eager", broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.task_always_eager = True

    @app.task(shared=False, base=OjsTask, retry_policy={"max_attempts": 5})
    def flaky() -> None:
        raise ValueError("boom")

    EAGER_WARNED.discard(flaky.name)
    with caplog.at_level(logging.WARNING, logger="celery_ext"):
        results = [flaky.delay() for _ in range(2)]
    assert all(isinstance(r.result, ValueError) for r in results)  # raised once, as natively
    warned = [r for r in caplog.records if r.name == "celery_ext" and flaky.name in r.getMessage()]
    assert len(warned) == 1
    assert "no retries" in warned[0].getMessage()


def test_header_state_is_untouched_by_publish_dicts() -> None:
    """The ``ojs`` header of a message sent with a publish dict carries no OJS override."""
    app = Celery("hdr", broker="memory://", backend="cache+memory://", set_as_current=False)

    @app.task(shared=False, base=OjsTask, name="first-contact.header")
    def job() -> None: ...

    seen = _published(app, lambda: job.apply_async(retry_policy={"max_retries": 0}))
    assert HEADER in seen["headers"]
    assert HeaderState.from_headers(seen["headers"]).policy is None
