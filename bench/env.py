"""The machine and brokers a benchmark runs on, and cleaning up after it.

Other engineers use the same Redis and RabbitMQ, so every run works under a
namespace of its own (``ojs-bench-<token>``) and deletes only the keys under
that prefix and the queues it names itself; never FLUSHDB.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import socket
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

#: Redis for brokers, result backends and job records.
REDIS_URL = os.environ.get("OJS_REDIS_URL", "redis://127.0.0.1:6379/0")
#: RabbitMQ, in kombu's spelling (vhost ``/`` is the trailing ``//``).
AMQP_URL = os.environ.get("OJS_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
#: Loggers silenced during a run: failures are planned, and logging them is not the subject.
_NOISY = ("celery", "kombu", "dramatiq", "celery_ext", "dramatiq_ext", "ojs_adapters")


def namespace(label: str) -> str:
    """A fresh prefix for keys and queues, e.g. ``ojs-bench-celery-redis-1a2b3c4d``."""
    return f"ojs-bench-{label}-{uuid.uuid4().hex[:8]}"


def pika_url(amqp_url: str = AMQP_URL) -> str:
    """The AMQP URL in pika's spelling: kombu's ``//`` (vhost ``/``) is ``/%2F``."""
    return amqp_url[:-2] + "/%2F" if amqp_url.endswith("//") else amqp_url


def reachable(broker: str) -> bool:
    """Whether the broker named ``redis`` or ``rabbitmq`` accepts connections."""
    port = 6379 if broker == "redis" else 5672
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


def delete_redis_keys(prefix: str) -> int:
    """Delete every Redis key starting with ``prefix``; return how many."""
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
    for start in range(0, len(keys), 500):
        client.delete(*keys[start:start + 500])
    client.close()
    return len(keys)


#: Redis round trips this process has made, once ``count_redis_round_trips`` ran.
ROUND_TRIPS = [0]


def count_redis_round_trips() -> None:
    """Count every request this process sends to Redis (a pipeline or script counts once).

    Deterministic where wall time is not: the difference over a batch, divided by its
    jobs, is what each job costs in round trips (workers run in this process). Counted
    where redis-py writes a request (``send_packed_command``), so commands a Lua script
    runs inside Redis are not counted, and other clients of the server never are.
    """
    from redis.connection import AbstractConnection

    if getattr(AbstractConnection, "_ojs_bench_counted", False):
        return
    send = AbstractConnection.send_packed_command

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        ROUND_TRIPS[0] += 1  # a lost increment under a thread switch is noise, not bias
        return send(self, *args, **kwargs)

    AbstractConnection.send_packed_command = counted  # type: ignore[method-assign]
    AbstractConnection._ojs_bench_counted = True  # type: ignore[attr-defined]


def delete_rabbitmq_queues(names: Iterable[str]) -> None:
    """Delete the RabbitMQ queues ``names`` (ones this run declared), ignoring missing ones."""
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(pika_url()))
    try:
        for name in names:
            channel = connection.channel()  # a missing queue closes it: one channel per queue
            with contextlib.suppress(Exception):
                channel.queue_delete(name)
    finally:
        connection.close()


def quiet_logging() -> None:
    """Silence the frameworks' and adapters' per-job logs (the same on both sides)."""
    for name in _NOISY:
        logging.getLogger(name).setLevel(logging.CRITICAL)


def cpu_model() -> str:
    """The CPU model from ``/proc/cpuinfo`` (else ``platform.processor()``)."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages."""
    return [round(x, 2) for x in os.getloadavg()]


def rss_kib(pid: int | str = "self") -> dict[str, int]:
    """``VmRSS`` (now) and ``VmHWM`` (peak) of a process, in KiB, from ``/proc``."""
    out: dict[str, Any] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            out[name] = int(value.split()[0])
    return out
