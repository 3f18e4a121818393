"""Binary delay levels: a retry waits on a RabbitMQ broker, not in a worker (RET-11).

A message that must wait ``s`` whole seconds (1 <= s < 2**28) is published to the
top level's exchange with the routing key ``<28 bits of s, one word each>.<destination>``.
Level ``n`` is a topic exchange and a queue whose messages expire after 2**n seconds
and are then dead-lettered to level ``n - 1`` (level 0: to the delivery exchange).
At each level the message either waits in the queue (its bit is 1) or passes
straight to the next level's exchange (bit 0), so it waits exactly ``s`` seconds in
all, and the delivery exchange routes it to ``<destination>`` by a binding of 28
wildcard words and the destination's name, whatever that queue's own exchange is.

This is the layout of kombu's native delayed delivery, names and queue arguments
included (so levels kombu declared are ours, and the reverse), described as data that
``declare`` puts on any client's channel. One set of levels serves every destination
queue of a vhost and any delay up to ``MAX_SECONDS``; ``Declared`` declares it once per
process and broker.

>>> routing_key(5, "emails.DQ")[-21:]
'0.0.0.1.0.1.emails.DQ'
>>> binding_key("emails.DQ").count("*")
28
>>> levels = DelayLevels("ojs_dramatiq_delayed")
>>> levels.level(27), levels.delivery
('ojs_dramatiq_delayed_27', 'ojs_dramatiq_delayed_delivery')
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Hashable
from typing import NamedTuple, Protocol

#: Bits of the delay in whole seconds: the number of levels.
BITS = 28
#: The level a parked message is published to.
TOP_LEVEL = BITS - 1
#: Longest delay the levels can hold, in seconds (about 8.5 years).
MAX_SECONDS = 2 ** BITS - 1
#: Longest AMQP routing key, in bytes.
_MAX_KEY_BYTES = 255
#: The queue types the levels can have (``x-queue-type``).
QUEUE_TYPES = ("quorum", "classic")
#: Seconds before a failed declaration of the levels is tried again.
RETRY_DECLARE = 60.0


class LevelQueue(NamedTuple):
    """One level's queue: its name, message TTL (ms) and dead-letter exchange."""

    name: str
    ttl_ms: int
    dead_letter_exchange: str

    def arguments(self, queue_type: str = "quorum") -> dict[str, object]:
        """The queue's arguments, as kombu declares them: a quorum queue dead-letters at
        least once (a broker crash between two levels loses nothing).

        >>> LevelQueue("d_0", 1000, "d_delivery").arguments("classic")["x-message-ttl"]
        1000
        """
        if queue_type not in QUEUE_TYPES:
            raise ValueError(f"queue_type must be one of {QUEUE_TYPES}, got {queue_type!r}")
        arguments: dict[str, object] = {
            "x-queue-type": queue_type, "x-overflow": "reject-publish",
            "x-message-ttl": self.ttl_ms, "x-dead-letter-exchange": self.dead_letter_exchange}
        if queue_type == "quorum":
            arguments["x-dead-letter-strategy"] = "at-least-once"
        return arguments


class Binding(NamedTuple):
    """A binding from exchange ``source`` to ``destination`` (a queue or an exchange)."""

    source: str
    destination: str
    routing_key: str


class Topology(NamedTuple):
    """Everything to declare: topic exchanges, level queues, queue and exchange bindings."""

    exchanges: tuple[str, ...]
    queues: tuple[LevelQueue, ...]
    queue_bindings: tuple[Binding, ...]
    exchange_bindings: tuple[Binding, ...]


class DelayLevels(NamedTuple):
    """The delay levels named ``<base>_0`` .. ``<base>_27`` and ``<base>_delivery``."""

    base: str

    def level(self, number: int) -> str:
        """The exchange and queue name of level ``number``."""
        return f"{self.base}_{number}"

    @property
    def delivery(self) -> str:
        """The topic exchange the last level hands messages to."""
        return f"{self.base}_delivery"

    def topology(self) -> Topology:
        """What to declare, from the top level down (see the module docstring)."""
        queues, queue_bindings, exchange_bindings = [], [], []
        for number in range(TOP_LEVEL, -1, -1):
            skip = "*." * (TOP_LEVEL - number)  # the bits of the levels above
            below = self.level(number - 1) if number else self.delivery
            queues.append(LevelQueue(self.level(number), 2 ** number * 1000, below))
            queue_bindings.append(Binding(self.level(number), self.level(number),
                                          f"{skip}1.#"))
            exchange_bindings.append(Binding(self.level(number), below, f"{skip}0.#"))
        exchanges = (*(self.level(n) for n in range(TOP_LEVEL, -1, -1)), self.delivery)
        return Topology(exchanges, tuple(queues), tuple(queue_bindings), tuple(exchange_bindings))


def routing_key(seconds: int, destination: str) -> str:
    """The key that makes a message wait ``seconds`` (1..``MAX_SECONDS``), then go to
    ``destination``."""
    if not 1 <= seconds <= MAX_SECONDS:
        raise ValueError(f"seconds must be in 1..{MAX_SECONDS}, got {seconds}")
    return ".".join(format(seconds, f"0{BITS}b")) + "." + destination


def binding_key(destination: str) -> str:
    """The key binding ``destination`` to the delivery exchange: any 28 bits, then its name."""
    return ".".join(["*"] * BITS) + "." + destination


def routable(destination: str) -> bool:
    """Whether ``destination`` can end a delay routing key: a name of whole words, no
    wildcards, and the key within AMQP's 255 bytes.

    >>> routable("emails.high"), routable("a.*.b"), routable("x" * 300)
    (True, False, False)
    """
    words = destination.split(".")
    return bool(destination) and all(words) and not ({"*", "#"} & set(words)) and \
        len(binding_key(destination).encode()) <= _MAX_KEY_BYTES


class LevelChannel(Protocol):
    """The AMQP methods that declare the levels, as pika names them (a pika channel is one;
    the Celery adapter wraps kombu's)."""

    def exchange_declare(self, *, exchange: str, exchange_type: str, durable: bool) -> object:
        """Declare a durable exchange of ``exchange_type``."""

    def queue_declare(self, *, queue: str, durable: bool, arguments: dict[str, object]) -> object:
        """Declare a durable queue with ``arguments``."""

    def queue_bind(self, *, queue: str, exchange: str, routing_key: str) -> object:
        """Bind ``queue`` to ``exchange``."""

    def exchange_bind(self, *, destination: str, source: str, routing_key: str) -> object:
        """Bind exchange ``destination`` to ``source``."""


def declare(channel: LevelChannel, levels: DelayLevels, *, queue_type: str = "quorum") -> None:
    """Declare ``levels`` on ``channel``: durable topic exchanges, ``queue_type`` queues
    (``QUEUE_TYPES``), their bindings. Levels that exist with the same arguments are
    left as they are; with others the broker closes the channel (a channel error)."""
    topology = levels.topology()
    arguments = [queue.arguments(queue_type) for queue in topology.queues]  # check it first
    for exchange in topology.exchanges:
        channel.exchange_declare(exchange=exchange, exchange_type="topic", durable=True)
    for queue, queue_arguments in zip(topology.queues, arguments, strict=True):
        channel.queue_declare(queue=queue.name, durable=True, arguments=queue_arguments)
    for binding in topology.queue_bindings:
        channel.queue_bind(queue=binding.destination, exchange=binding.source,
                           routing_key=binding.routing_key)
    for binding in topology.exchange_bindings:
        channel.exchange_bind(destination=binding.destination, source=binding.source,
                              routing_key=binding.routing_key)


class Declared:
    """Which delay levels this process declared, by key (the adapter's: broker and names).

    ``ensure`` runs ``declare()`` once per process and key (a forked child declares
    again); when it answers ``False`` (the adapter logged why), ``ensure`` answers
    ``False`` for ``retry_after`` s instead of trying again on every park.

    >>> declared = Declared()
    >>> declared.ensure("vhost", lambda: True), declared.ensure("vhost", lambda: 1 / 0)
    (True, True)
    """

    def __init__(self, retry_after: float = RETRY_DECLARE) -> None:
        self.retry_after = retry_after
        self._lock = threading.Lock()
        self._declared: set[tuple[int, Hashable]] = set()
        self._failed: dict[tuple[int, Hashable], float] = {}

    def ensure(self, key: Hashable, declare: Callable[[], bool]) -> bool:
        """Whether the levels of ``key`` are declared, running ``declare()`` if need be
        (under a lock: one declaration at a time; what it raises propagates)."""
        mine = (os.getpid(), key)
        with self._lock:
            if mine in self._declared:
                return True
            if time.monotonic() - self._failed.get(mine, -self.retry_after) < self.retry_after:
                return False
            if not declare():
                self._failed[mine] = time.monotonic()
                return False
            self._declared.add(mine)
            return True

    def forget(self, which: Callable[[Hashable], bool] = lambda key: True) -> None:
        """Declare the levels of the keys ``which`` accepts (all by default) again on their
        next use: after a failed park, a level may be gone."""
        with self._lock:
            self._declared = {k for k in self._declared if not which(k[1])}
