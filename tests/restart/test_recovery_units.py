"""The two recovery steps of issue 8, one at a time, against a private Redis that restarts.

- Celery (``celery_ext._orphans`` via the heartbeat): a delivery held when its channel
  closed while Redis was down goes back to its queue once Redis answers; one that
  was delivered again since (a newer score) is left alone.
- Dramatiq (``dramatiq_ext._redis_delays``): ids left in a worker's ``.DQ`` ack set go
  back to ``.DQ`` when the consumer of that queue starts again.
"""

from __future__ import annotations

import time
from contextlib import suppress

import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.message import Message
from kombu import Connection

from celery_ext._heartbeat import Heartbeat
from dramatiq_ext._redis_delays import recover_delays
from tests.restart.servers import PrivateRedis


def test_issue8_celery_delivery_held_through_a_redis_restart_goes_back(
        private_redis: PrivateRedis) -> None:
    conn = Connection(private_redis.url, transport_options={"visibility_timeout": 3600})
    simple = conn.SimpleQueue("ojs-orphans", no_ack=False)
    simple.put("waiting")
    simple.put("taken-again")
    waiting, taken = simple.get(timeout=5), simple.get(timeout=5)
    beat = Heartbeat()
    assert beat.hold(waiting, start=False) and beat.hold(taken, start=False)
    private_redis.stop()
    with suppress(Exception):  # kombu's own restore at close fails: Redis is down
        waiting.channel.close()
    assert beat.tick() is not None and beat.held() == 0  # closed: kept to hand back later
    private_redis.start()
    client = redis.Redis.from_url(private_redis.url)
    client.zadd("unacked_index", {taken.delivery_tag: time.time() + 60})  # delivered again
    assert beat.tick() is None  # handed back: nothing left to do
    with Connection(private_redis.url) as again:
        queue = again.SimpleQueue("ojs-orphans", no_ack=True)
        assert queue.get(timeout=5).payload == "waiting"
        with suppress(queue.Empty):
            raise AssertionError(f"handed back twice or too much: {queue.get(timeout=0.5)}")
        queue.close()
    assert client.zscore("unacked_index", waiting.delivery_tag) is None
    assert client.zscore("unacked_index", taken.delivery_tag) is not None  # still its holder's


def test_issue8_dramatiq_stranded_delay_ids_are_requeued_when_the_consumer_restarts(
        private_redis: PrivateRedis) -> None:
    broker = RedisBroker(url=private_redis.url, namespace="ojs-delays")
    try:
        assert recover_delays(broker) and recover_delays(broker)  # wrapped once
        broker.declare_queue("jobs")
        message = Message(queue_name="jobs", actor_name="job", args=(), kwargs={}, options={})
        broker.enqueue(message, delay=60_000)  # a retry: to jobs.DQ
        held = next(broker.consume("jobs.DQ", prefetch=1, timeout=100))
        assert held is not None and held.message_id == message.message_id
        client = redis.Redis.from_url(private_redis.url)
        acks = f"ojs-delays:__acks__.{broker.broker_id}.jobs.DQ"
        assert client.smembers(acks)  # held in this worker's memory, as Dramatiq does
        # The consumer thread hit a connection error and dropped its delay queue; the
        # new consumer first puts the stranded id back.
        again = next(broker.consume("jobs.DQ", prefetch=1, timeout=100))
        assert again is not None and again.message_id == message.message_id
        assert again.options["eta"] == held.options["eta"]  # still not due before its delay
    finally:
        broker.close()
