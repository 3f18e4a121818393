"""``url_kind``: the one reader of ``--broker`` URLs, for the demo's check and both drivers."""

from __future__ import annotations

import subprocess
import sys

import click
import pytest

from conformance._demo_needs import broker_kind as demo_kind
from conformance.drivers import MEMORY_ALIASES, SCHEMES, url_kind
from conformance.drivers._celery_broker import broker_kind as celery_kind
from conformance.drivers._dramatiq_setup import broker_kind as dramatiq_kind

#: URLs and the kind every reader gives them.
TAKEN = {
    **dict.fromkeys(MEMORY_ALIASES, "memory"),
    "redis://127.0.0.1:6379/0": "redis", "rediss://:pw@h:6380/1": "redis", "redis://": "redis",
    "amqp://guest:guest@127.0.0.1:5672//": "amqp", "amqps://h/%2F": "amqp",
}
#: What no reader takes: other schemes, a scheme without ``//``, odd case, no scheme at all.
REFUSED = ["sqs://queue", "memory://x", "stub://x", "redis:/h", "REDIS://h", "localhost:6379",
           "", "redis", "amqp"]


def test_url_kind_reads_the_scheme_and_the_memory_names() -> None:
    for url, kind in TAKEN.items():
        assert url_kind(url) == kind, url
    for url in [*REFUSED, "pyamqp://h//"]:
        assert url_kind(url) is None, url
    assert url_kind("pyamqp://h//", {**SCHEMES, "pyamqp": "amqp"}) == "amqp"
    assert url_kind("memory", {}) == "memory" and url_kind("redis://h", {}) is None


def test_the_demo_and_each_driver_map_the_shared_reading_to_their_own_kinds() -> None:
    dramatiq_names = {"memory": "stub", "redis": "redis", "amqp": "rabbitmq"}
    for url, kind in TAKEN.items():
        assert (demo_kind(url), celery_kind(url), dramatiq_kind(url)) == (
            kind, kind, dramatiq_names[kind]), url
    assert celery_kind("pyamqp://guest@h//") == "amqp"  # kombu's spelling: Celery's only
    for url in ["pyamqp://guest@h//", *REFUSED]:
        with pytest.raises(click.BadParameter, match=r"give 'memory', a redis://\.\.\. or an amqp"):
            demo_kind(url)
        with pytest.raises(ValueError, match=r"the Dramatiq driver takes memory, redis://\.\.\. "
                                             r"or amqp://\.\.\., not"):
            dramatiq_kind(url)
    for url in REFUSED:
        with pytest.raises(ValueError, match=r"the Celery driver takes memory, redis://\.\.\. "
                                             r"or amqp://\.\.\., not"):
            celery_kind(url)


def test_the_shared_reader_imports_no_framework() -> None:
    code = ("import sys, conformance.drivers, conformance._demo_needs\n"
            "print(sorted({'celery', 'kombu', 'dramatiq', 'pika', 'redis'} & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "[]"
