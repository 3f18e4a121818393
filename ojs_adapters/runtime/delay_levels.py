"""Binary delay levels: a retry waits on a RabbitMQ broker, not in a worker (RET-11).

A message that must wait ``s`` whole seconds (1 <= s < 2**28) is published to the
top level's exchange with the routing key ``<28 bits of s, one word each>.<destination>``.
Level ``n`` is a topic exchange and a queue whose messages expire after 2**n seconds
and are then dead-lettered to level ``n - 1`` (level 0: to the delivery exchange).
At each level the message either waits in the queue (its bit is 1) or passes
straight to the next level's exchange (bit 0), so it waits exactly ``s`` seconds in
all, and the delivery exchange routes it to ``<destination>`` by a binding of 28
wildcard words and the destination's name, whatever that queue's own exchange is.

This is the layout of kombu's native delayed delivery, described here as data so that
any client can declare it; the core declares nothing. One set of levels serves every
destination queue of a vhost and any delay up to ``MAX_SECONDS``.

>>> routing_key(5, "emails.DQ")[-21:]
'0.0.0.1.0.1.emails.DQ'
>>> binding_key("emails.DQ").count("*")
28
>>> levels = DelayLevels("ojs_dramatiq_delayed")
>>> levels.level(27), levels.delivery
('ojs_dramatiq_delayed_27', 'ojs_dramatiq_delayed_delivery')
"""

from __future__ import annotations

from typing import NamedTuple

#: Bits of the delay in whole seconds: the number of levels.
BITS = 28
#: The level a parked message is published to.
TOP_LEVEL = BITS - 1
#: Longest delay the levels can hold, in seconds (about 8.5 years).
MAX_SECONDS = 2 ** BITS - 1
#: Longest AMQP routing key, in bytes.
_MAX_KEY_BYTES = 255


class LevelQueue(NamedTuple):
    """One level's queue: its name, message TTL (ms) and dead-letter exchange."""

    name: str
    ttl_ms: int
    dead_letter_exchange: str


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
