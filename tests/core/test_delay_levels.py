"""The delay-level topology (RET-11 on RabbitMQ): routed as AMQP topic exchanges would,
every delay takes exactly one path, waits exactly its seconds, and ends at its queue."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ojs_adapters.runtime.delay_levels import (
    BITS,
    MAX_SECONDS,
    DelayLevels,
    binding_key,
    routable,
    routing_key,
)

LEVELS = DelayLevels("ojs_test_delayed")
TOPOLOGY = LEVELS.topology()
WORDS = st.text("abcxyz_-0123456789", min_size=1, max_size=8)
QUEUES = st.lists(WORDS, min_size=1, max_size=4).map(".".join)


def topic_match(pattern: str, key: str) -> bool:
    """AMQP topic matching: ``*`` is one word, ``#`` zero or more."""
    def match(p: list[str], k: list[str]) -> bool:
        if not p:
            return not k
        if p[0] == "#":
            return any(match(p[1:], k[i:]) for i in range(len(k) + 1))
        return bool(k) and p[0] in ("*", k[0]) and match(p[1:], k[1:])
    return match(pattern.split("."), key.split("."))


def route(key: str) -> tuple[int, list[str]]:
    """Follow a message published to the top level: (ms waited, queues it waited in)."""
    ttl = {q.name: q for q in TOPOLOGY.queues}
    exchange, waited, path = LEVELS.level(BITS - 1), 0, []
    while exchange != LEVELS.delivery:
        # (is a queue, name): a level's queue and exchange share its name
        targets = [(kind, b.destination)
                   for kind, bindings in ((True, TOPOLOGY.queue_bindings),
                                          (False, TOPOLOGY.exchange_bindings))
                   for b in bindings if b.source == exchange and topic_match(b.routing_key, key)]
        assert len(targets) == 1, (exchange, key, targets)  # one path, never a copy
        [(is_queue, target)] = targets
        if is_queue:  # waits its TTL, then is dead-lettered to the next exchange
            waited += ttl[target].ttl_ms
            path.append(target)
            exchange = ttl[target].dead_letter_exchange
        else:
            exchange = target
    return waited, path


@given(st.integers(1, MAX_SECONDS), QUEUES)
def test_ret11_every_delay_waits_exactly_its_seconds_then_reaches_its_queue(
        seconds: int, queue: str) -> None:
    key = routing_key(seconds, queue)
    waited, path = route(key)
    assert waited == seconds * 1000
    assert len(path) == bin(seconds).count("1")
    assert topic_match(binding_key(queue), key)  # the delivery exchange's binding takes it


@given(st.integers(1, MAX_SECONDS), QUEUES, QUEUES)
def test_a_delayed_message_reaches_no_other_queue(seconds: int, queue: str, other: str) -> None:
    if other != queue:
        assert not topic_match(binding_key(other), routing_key(seconds, queue))


def test_levels_are_28_queues_with_doubling_ttls_each_dead_lettering_to_the_next() -> None:
    assert [q.ttl_ms for q in TOPOLOGY.queues] == [2 ** n * 1000 for n in range(27, -1, -1)]
    assert [q.dead_letter_exchange for q in TOPOLOGY.queues] == [
        *(LEVELS.level(n) for n in range(26, -1, -1)), LEVELS.delivery]
    assert len(TOPOLOGY.exchanges) == len(set(TOPOLOGY.exchanges)) == BITS + 1


@pytest.mark.parametrize("seconds", [0, -1, MAX_SECONDS + 1])
def test_a_delay_out_of_range_is_refused(seconds: int) -> None:
    with pytest.raises(ValueError, match="seconds must be in"):
        routing_key(seconds, "q")


@pytest.mark.parametrize(("queue", "ok"), [
    ("emails", True), ("emails.high.DQ", True), ("", False), ("a..b", False),
    ("a.*.b", False), ("a.#", False), ("q" * 200, False)])
def test_only_names_of_whole_words_without_wildcards_are_routable(queue: str, ok: bool) -> None:
    assert routable(queue) is ok
