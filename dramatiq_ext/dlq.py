"""Dead-letter management for Dramatiq: ``ojs_adapters.runtime.dlq`` over the ``<queue>.XQ`` queues.

``OjsRetries`` dead-letters a job as a message that carries its full history in
``options["ojs"]``, so every message in a ``.XQ`` queue is a ``DeadLetter`` as it stands.
Replay sends a copy back to its queue as attempt 1 and removes that dead message in one
atomic step (``_dlq_redis``, ``_dlq_rabbitmq``, ``_dlq_stub``). Notes for operators:
docs/operations/dead-letters.md.

>>> import dramatiq
>>> from dramatiq.brokers.stub import StubBroker
>>> from dramatiq_ext import OjsRetries
>>> broker = StubBroker(); broker.add_middleware(OjsRetries())
>>> dlq = dead_letter_queue(broker)
>>> dlq.list().total
0
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import ModuleType
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from dramatiq import broker as dramatiq_broker
from dramatiq.broker import Broker
from dramatiq.common import q_name, xq_name

from dramatiq_ext._dlq_common import JobRecords, dead_letter_of, replay_message
from dramatiq_ext._dlq_redis import RedisDeadLetters
from dramatiq_ext._dlq_stub import StubDeadLetters
from dramatiq_ext.stores import RecordStore, RedisRecordStore
from ojs_adapters.runtime.dlq import (
    DeadLetterQueueGiven,
    DeadLetters,
    DeadLetterStore,
    load_object,
)

#: The ``options`` keys ``open_dead_letter_queue`` reads (``ojs-retry dlq --option``).
OPTION_KEYS = ("management", "namespace", "records", "records_prefix")

# The helpers the broker stores share live in ``_dlq_common``; kept importable from here.
__all__ = ["JobRecords", "dead_letter_of", "dead_letter_queue", "open_dead_letter_queue",
           "replay_message"]


def dead_letter_queue(broker: Broker, *, queues: Sequence[str] = (),
                      store: RecordStore | None = None, discover: bool = False,
                      management: str | None = None) -> DeadLetters:
    """The dead letters of ``broker`` (StubBroker, RedisBroker or RabbitmqBroker).

    ``queues`` adds queue names to look at beyond those found. Redis and the stub
    list every dead-letter queue. A RabbitMQ connection cannot list queues: there
    the broker's declared queues (its actors') plus ``queues`` are looked at, and
    with ``discover`` every ``.XQ`` the management API lists (``management``: its
    URL, default beside the broker; ``"none"`` skips it), else ``default.XQ`` too.
    ``coverage()`` tells which. ``store`` is where the workers keep job records
    (see ``JobRecords``).
    """
    records = JobRecords(broker, store)
    kind = type(broker).__name__
    if kind == "StubBroker":
        return DeadLetters(StubDeadLetters(broker, records, queues))
    if kind == "RedisBroker":
        return DeadLetters(RedisDeadLetters(broker, records, queues))
    if kind == "RabbitmqBroker":
        from dramatiq_ext._dlq_rabbitmq import RabbitmqDeadLetters  # pika: an optional extra

        return DeadLetters(RabbitmqDeadLetters(broker, records, queues, discover=discover,
                                               management=management))
    raise TypeError(f"no dead-letter support for {kind}")


def open_dead_letter_queue(*, app: str | None = None, broker: str | None = None,
                           queues: Sequence[str] = (),
                           options: Mapping[str, str] | None = None) -> DeadLetters:
    """The ``runtime.dlq`` entry point: ``app`` names a broker object, or ``broker`` a URL.

    ``app`` is read as ``dramatiq`` reads its first argument, from the current
    directory: ``module:broker``, or ``module`` alone for its ``broker`` attribute,
    else the global broker importing it set. The job records are then updated
    where the workers keep them (its ``OjsRetries`` store). With a URL,
    ``options["namespace"]`` is the Redis broker's namespace (default ``dramatiq``)
    and records go where ``OjsRetries`` keeps them by default for that broker
    (Redis without ``Results``: the broker's Redis). ``options["records"]`` (a
    Redis URL, with ``records_prefix``) names a ``RedisRecordStore`` instead. A
    RabbitMQ URL alone reaches no records: list, show, delete, purge and prune
    work, replay refuses (``JobRecords``). On RabbitMQ every dead-letter queue is
    looked for (``discover``; ``options["management"]`` is the API's URL or ``none``).
    A ``.XQ`` name in ``queues`` raises ``DeadLetterQueueGiven``. An AMQP URL's vhost is
    read as kombu reads it (``amqp://host//`` is vhost ``/``: ``pika_vhost``).
    """
    for name in queues:  # Dramatiq's own naming: <queue>.XQ
        if name != q_name(name) and xq_name(q_name(name)) == name:
            raise DeadLetterQueueGiven(name, q_name(name))
    options = options or {}
    store = RedisRecordStore(url=options["records"], prefix=options.get(
        "records_prefix", "ojs-record")) if options.get("records") else None
    management = options.get("management")

    def opened(found: Broker) -> DeadLetters:
        return dead_letter_queue(found, queues=queues, store=store, discover=True,
                                 management=management)

    if app:
        found = opened(_broker_named(app))
        found.broker_url = _url_of(found.store)
        return found
    if not broker:
        raise ValueError("give --app module[:broker] or --broker URL")
    scheme = broker.split(":", 1)[0]
    built: Broker
    if scheme in ("redis", "rediss", "unix"):
        from dramatiq.brokers.redis import RedisBroker

        built = RedisBroker(  # type: ignore[no-untyped-call]
            url=broker, namespace=options.get("namespace", "dramatiq"))
    elif scheme in ("amqp", "amqps"):
        from dramatiq.brokers.rabbitmq import RabbitmqBroker

        built = RabbitmqBroker(url=";".join(pika_vhost(url) for url in broker.split(";")))
    else:
        raise ValueError(f"unsupported Dramatiq broker URL scheme {scheme!r}")
    owning = _Owning(opened(built).store, built)
    owning.broker_url = broker
    return owning


def pika_vhost(url: str) -> str:
    """``url`` with its vhost spelled so pika reads it as kombu does: ``//`` is vhost ``/``.

    kombu (and Celery users) take everything after the first ``/`` as the vhost; pika
    takes one path segment, reading ``amqp://host//`` as vhost ``""``, which RabbitMQ
    refuses (``//x`` would be ``""`` too, where kombu reads ``/x``).

    >>> pika_vhost("amqp://guest:guest@localhost:5672//")
    'amqp://guest:guest@localhost:5672/%2F'
    >>> pika_vhost("amqp://h//x?heartbeat=5"), pika_vhost("amqp://h/%2F"), pika_vhost("amqp://h")
    ('amqp://h/%2Fx?heartbeat=5', 'amqp://h/%2F', 'amqp://h')
    """
    parts = urlsplit(url)
    if "/" not in parts.path[1:]:
        return url  # one segment (or none): pika and kombu agree
    return urlunsplit(parts._replace(path="/" + quote(unquote(parts.path[1:]), safe="")))


def _broker_named(app: str) -> Broker:
    """The broker ``app`` names (``module:attr``, or ``module``: see ``open_dead_letter_queue``)."""
    found = load_object(app)
    if isinstance(found, ModuleType):
        found = getattr(found, "broker", None) or dramatiq_broker.global_broker
        if found is None:
            raise TypeError(f"{app} has no 'broker' and set no global broker; "
                            f"name it: --app {app}:ATTRIBUTE")
    if not isinstance(found, Broker):
        raise TypeError(f"{app} is {type(found).__name__}, not a Dramatiq broker")
    return found


def _url_of(store: DeadLetterStore) -> str | None:
    """Where the broker of ``store`` is (no password), for messages; ``None`` for the stub."""
    broker = getattr(store, "broker", None)
    parameters = getattr(broker, "parameters", None)  # RabbitMQ: pika's
    if parameters is not None:
        first = parameters[0] if isinstance(parameters, list) else parameters
        user = getattr(first.credentials, "username", "")
        scheme = "amqps" if getattr(first, "ssl_options", None) else "amqp"
        return f"{scheme}://{user}@{first.host}:{first.port}/" \
               f"{quote(first.virtual_host, safe='')}"
    client = getattr(broker, "client", None)  # Redis
    if client is None:
        return None
    kwargs = client.connection_pool.connection_kwargs
    if "path" in kwargs:
        return f"unix://{kwargs['path']}"
    scheme = "rediss" if "ssl" in client.connection_pool.connection_class.__name__.lower() \
        else "redis"
    return f"{scheme}://{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/" \
           f"{kwargs.get('db', 0)}"


class _Owning(DeadLetters):
    """``DeadLetters`` over a broker it built itself, closed with it."""

    def __init__(self, store: DeadLetterStore, broker: Broker) -> None:
        super().__init__(store)
        self._broker = broker

    def close(self) -> None:
        super().close()
        self._broker.close()
