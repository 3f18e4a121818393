"""Running one console test cell: real workers, real ``ojs-retry web`` servers, a real browser.

A ``Running`` cell has workers on its own queues and prefixes (Celery's in-process
worker, or a ``dramatiq.Worker``), statistics flushed every 0.3 s under a prefix of
its own, jobs that failed (two dead letters, one parked retry: on RabbitMQ, counted in
the console's index of the delay levels), and two servers: ``rw`` with an operator
token and ``ro`` without. ``send(task, n)`` sends one more job.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from ojs_adapters import JobRecord
from ojs_adapters.runtime.stats import disable_stats, enable_stats
from tests.brokers import AMQP_URL, REDIS_URL, brokers_required
from tests.web.apps import HEALED, RUNS, Cell, celery_app_for, dramatiq_broker_for

ROOT = Path(__file__).resolve().parents[2]
#: The operator token of the read-write servers.
TOKEN = "test-operator-token-0123456789"
#: Where chromium is (Debian's package).
CHROMIUM = os.environ.get("OJS_CHROMIUM", "/usr/bin/chromium")
#: Flags for a headless Chromium on a machine with no network beyond loopback.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-dev-shm-usage"]


def need_browser() -> None:
    """Skip (fail under CI=true / OJS_REQUIRE_BROKERS=1) without Chromium or Playwright."""
    missing = None
    if not Path(CHROMIUM).exists():
        missing = f"Chromium is not installed at {CHROMIUM} (apt-get install chromium)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            missing = "playwright is not installed (pip install -e '.[dev]')"
    if missing is None:
        return
    if brokers_required():
        pytest.fail(f"{missing}, and CI=true / OJS_REQUIRE_BROKERS=1 forbid skipping")
    pytest.skip(missing)


@contextmanager
def logged() -> Iterator[list[logging.LogRecord]]:
    """The log records of the workers (in this process) while the block runs: the
    adapters' INFO and up, everything's WARNING and up."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep(logging.INFO)
    adapters = [logging.getLogger(name) for name in ("celery_ext", "dramatiq_ext")]
    levels = [x.level for x in adapters]
    root = logging.getLogger()
    root.addHandler(handler)
    for logger in adapters:
        logger.setLevel(logging.INFO)
    try:
        yield records
    finally:
        root.removeHandler(handler)
        for logger, level in zip(adapters, levels, strict=True):
            logger.setLevel(level)


def wait_for(check: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    """One ``ojs-retry web`` process."""

    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()


def start_server(cell: Cell, *, token: bool, log_dir: Path,
                 extra: tuple[str, ...] | list[str] = ()) -> Server:
    port = free_port()
    target = "celery_app" if cell.framework == "celery" else "dramatiq_broker"
    command = [shutil.which("ojs-retry", path=str(Path(sys.executable).parent)) or "ojs-retry",
               "web", "--framework", cell.framework, "--port", str(port),
               "--stats", REDIS_URL, "--stats-prefix", f"{cell.prefix}-stats", *extra]
    if "--broker" not in extra:
        command += ["--app", f"tests.web.apps:{target}"]
    env = {**os.environ, "OJS_WEB_TEST_CELL": cell.spec}
    env.pop("OJS_WEB_TOKEN", None)
    if token:
        env["OJS_WEB_TOKEN"] = TOKEN
    log = log_dir / f"web-{'rw' if token else 'ro'}-{port}.log"
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log.open("wb"),
                               stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"ojs-retry web exited: {log.read_text()[-2000:]}")
        try:
            return httpx.get(url + "/metrics", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(up, f"ojs-retry web on port {port}", timeout=30)
    return Server(url, process, log)


@dataclass
class Running:
    """A cell with workers, failed jobs and servers (see the module docstring)."""

    cell: Cell
    ids: dict[int, str]
    record: Callable[[str], JobRecord | None]
    dead_count: Callable[[], int]
    parked_count: Callable[[], int]
    send: Callable[[str, int], str]
    rw: Server
    ro: Server
    cleanup: list[Callable[[], None]] = field(default_factory=list)

    @property
    def redis(self) -> bool:
        return self.cell.kind == "redis"


def _drop(cell: Cell, queues: list[str]) -> None:
    """Delete the cell's Redis keys and RabbitMQ queues: nothing else."""
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    for key in client.scan_iter(match=f"{cell.prefix}*", count=1000):
        client.delete(key)
    if cell.kind == "amqp":
        import pika

        connection = pika.BlockingConnection(pika.URLParameters(
            AMQP_URL[:-2] + "/%2F" if AMQP_URL.endswith("//") else AMQP_URL))
        for name in queues:
            channel = connection.channel()
            with contextlib.suppress(Exception):
                channel.queue_delete(name)
        connection.close()


@contextmanager
def running(framework: str, kind: str, log_dir: Path) -> Iterator[Running]:
    """Start a cell: workers, failing jobs, the servers (see ``Running``)."""
    import redis

    cell = Cell(framework, kind, f"ojs-web-{uuid.uuid4().hex[:8]}")
    HEALED.clear()  # every job of a new cell fails until its test heals it
    RUNS.clear()
    os.environ["OJS_WEB_TEST_CELL"] = cell.spec
    enable_stats(client=redis.Redis.from_url(REDIS_URL), prefix=f"{cell.prefix}-stats",
                 interval=0.3)
    queues = [cell.queue, f"{cell.queue}.dead_letter"] if framework == "celery" else \
        [cell.queue, f"{cell.queue}.DQ", f"{cell.queue}.XQ"]
    with contextlib.ExitStack() as stack:
        stack.callback(_drop, cell, queues)  # last: after the workers and the flusher stop
        stack.callback(disable_stats)
        if framework == "celery":
            ids, record, dead, parked, send = stack.enter_context(_celery(cell))
        else:
            ids, record, dead, parked, send = stack.enter_context(_dramatiq(cell))
        wait_for(lambda: dead() == 2, "two dead letters")
        wait_for(lambda: (record(ids[3]) or JobRecord("", "", "", 0)).state == "retryable",
                 "the slow job to wait for its retry")
        wait_for(lambda: parked() == 1, "the slow job's retry to be parked")
        rw = start_server(cell, token=True, log_dir=log_dir)
        stack.callback(rw.stop)
        extra = ["--broker", REDIS_URL, "--option", f"namespace={cell.prefix}"] \
            if (framework, kind) == ("dramatiq", "redis") else []
        ro = start_server(cell, token=False, log_dir=log_dir, extra=extra)
        stack.callback(ro.stop)
        yield Running(cell, ids, record, dead, parked, send, rw, ro)


@contextmanager
def _celery(cell: Cell) -> Iterator[tuple[Any, ...]]:
    from celery.contrib.testing.worker import start_worker
    from celery.worker import state as worker_state

    from celery_ext import get_job_record

    app = celery_app_for(cell)
    worker_state.should_terminate = None  # an earlier cell's worker set it to stop
    dead_queue = f"{cell.queue}.dead_letter"

    def size(name: str) -> int:
        if cell.kind == "redis":
            import redis

            client = redis.Redis.from_url(REDIS_URL)
            return int(client.llen(f"{cell.prefix}:{name}"))
        with app.connection_for_write() as conn:
            try:
                return int(conn.default_channel.queue_declare(name, passive=True).message_count)
            except Exception:
                return 0

    def parked() -> int:
        """Retries parked on Redis, or noted in the console's index on RabbitMQ."""
        import redis

        from celery_ext._waiting import index_key

        key = f"{cell.prefix}:_ojs.parked" if cell.kind == "redis" else index_key(app)
        assert key is not None, "no index: the result backend is not Redis"
        return int(redis.Redis.from_url(REDIS_URL).zcount(key, time.time() - 5, "+inf"))

    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False,
                      queues=[cell.queue], loglevel="WARNING", shutdown_timeout=15):
        ids = {n: app.tasks["web.doomed"].delay(n).id for n in (1, 2)}
        ids[3] = app.tasks["web.slow"].delay(3).id
        yield (ids, lambda i: get_job_record(i, app=app), lambda: size(dead_queue), parked,
               lambda task, n: app.tasks[f"web.{task}"].delay(n).id)
        worker_state.should_terminate = 0  # wake the consumer loop now (see celery_ext tests)
        app.tasks["web.doomed"].apply_async((99,), queue=cell.queue)


@contextmanager
def _dramatiq(cell: Cell) -> Iterator[tuple[Any, ...]]:
    import dramatiq

    from dramatiq_ext import OjsRetries, get_job_record
    from dramatiq_ext._waiting import index_of

    broker = dramatiq_broker_for(cell)
    worker = dramatiq.Worker(broker, worker_timeout=50, worker_threads=2)
    worker.start()
    import redis

    client = redis.Redis.from_url(REDIS_URL)

    def dead() -> int:
        if cell.kind == "redis":
            return int(client.zcard(f"{cell.prefix}:{cell.queue}.XQ"))
        channel = broker.channel
        return int(channel.queue_declare(f"{cell.queue}.XQ", passive=True).method.message_count)

    index = index_of(next(m for m in broker.middleware if isinstance(m, OjsRetries))
                     .store_for(broker))
    # parked on Redis, or noted in the console's index on RabbitMQ (``_waiting``)
    assert index is not None, "no index: the records are not in Redis"
    parked_key = f"{cell.prefix}:_ojs.parked" if cell.kind == "redis" else index.key
    try:
        ids = {n: broker.actors["web_doomed"].send(n).message_id for n in (1, 2)}
        ids[3] = broker.actors["web_slow"].send(3).message_id
        yield (ids, lambda i: get_job_record(i, broker=broker), dead,
               lambda: int(client.zcount(parked_key, time.time() - 5, "+inf")),
               lambda task, n: broker.actors[f"web_{task}"].send(n).message_id)
    finally:
        worker.stop(timeout=5000)
        broker.close()
