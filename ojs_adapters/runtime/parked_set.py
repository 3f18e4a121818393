"""The Redis parked set: where a long retry waits on a Redis broker (RET-11), for both adapters.

A parked retry is one member of the sorted set ``PARKED_KEY`` (under the broker's key
prefix), scored by its due time in seconds since the epoch; the member holds the message
and where it goes, in the adapter's format. A ``Mover`` in each worker runs one Lua
script every ``POLL_SECONDS``: it takes the members due within ``LEAD`` s (``BATCH`` a
run), runs the adapter's ``PushStep`` on each (how a message reaches that framework's
queue) and removes it, all atomically: nothing lost, nothing moved twice by racing
workers, nothing that reaches a worker more than a lead early. The push step is Lua
because it must run inside that script. The caller passes the Redis client in; this
module imports no Redis library.

>>> step = PushStep("redis.call('RPUSH', ARGV[3], member)", ("ns:q",))
>>> step.script.splitlines()[1:3]
['for _, member in ipairs(due) do', "redis.call('RPUSH', ARGV[3], member)"]
>>> key_under("ns:")
'ns:_ojs.parked'
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ojs_adapters.runtime._periodic import Periodic
from ojs_adapters.runtime.parking import LEAD

#: The parked set's key, under the broker's key prefix.
PARKED_KEY = "_ojs.parked"
#: Most members one script run moves.
BATCH = 500
#: Default seconds between two rounds of a ``Mover``.
POLL_SECONDS = 0.5

#: KEYS[1] the parked set; ARGV[1] the horizon (a score), ARGV[2] the batch; the push
#: step runs once per due member, in ``member``, before it leaves the set.
_FRAME = """\
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, member in ipairs(due) do
{push}
  redis.call('ZREM', KEYS[1], member)
end
return #due
"""


def key_under(prefix: str) -> str:
    """The parked set's key under the key prefix ``prefix`` (separator included)."""
    return prefix + PARKED_KEY


def add(client: Any, key: str, member: str, due: float) -> None:
    """Park ``member`` in the set ``key`` until ``due`` (seconds since the epoch)."""
    client.zadd(key, {member: due})


@dataclass(frozen=True)
class PushStep:
    """How a due member reaches its framework's queue: Lua run for each, with the member
    in the local ``member`` and ``args`` as ``ARGV[3]`` on.

    >>> PushStep("redis.call('LPUSH', ARGV[3], member)", ("q",)).args
    ('q',)
    """

    lua: str
    args: tuple[str, ...] = ()

    @property
    def script(self) -> str:
        """The whole Lua script that moves the due members with this step."""
        return _FRAME.replace("{push}", self.lua.strip("\n"))


class Mover:
    """Moves the due members of the parked set ``key`` with ``push``, from a daemon thread.

    ``connect()`` returns the Redis client; after an error, ``disconnect()`` (if given)
    drops the broken connection and the next round connects again.

    >>> mover = Mover("ns:_ojs.parked", PushStep("redis.call('RPUSH', ARGV[3], member)",
    ...               ("ns:q",)), connect=lambda: redis_client)  # doctest: +SKIP
    >>> mover.start()  # doctest: +SKIP
    """

    def __init__(self, key: str, push: PushStep, connect: Callable[[], Any], *,
                 interval: float = POLL_SECONDS, name: str = "ojs-park-mover",
                 disconnect: Callable[[], None] | None = None,
                 logger: logging.Logger | None = None) -> None:
        self.key = key
        self.push = push
        self.interval = interval
        self._connect = connect
        self._disconnect = disconnect
        self._logger = logger or logging.getLogger(__name__)
        self._client: Any = None
        self._script: Any = None
        self._runner = Periodic(name, self._round, interval, on_error=self._drop,
                                logger=self._logger)

    def move_due(self, now: float | None = None) -> int:
        """Move every member due by ``now`` (default: the time now) plus ``max(LEAD,
        interval)``, the worker waiting out the rest; how many moved."""
        if self._client is None:
            self._client = self._connect()
            self._script = self._client.register_script(self.push.script)
        horizon = (time.time() if now is None else now) + max(LEAD, self.interval)
        moved = 0
        while True:
            count = int(self._script(keys=[self.key], client=self._client,
                                     args=[repr(horizon), BATCH, *self.push.args]))
            moved += count
            if count < BATCH:
                return moved

    def start(self) -> None:
        """Start the thread (a no-op while it runs)."""
        self._runner.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread and drop its connection."""
        self._runner.stop(timeout)
        self._drop()

    def _drop(self) -> None:
        self._client = self._script = None
        if self._disconnect is not None:
            with contextlib.suppress(Exception):  # closing a broken connection
                self._disconnect()

    def _round(self) -> None:
        moved = self.move_due()  # an error: ``Periodic`` logs it and calls ``_drop``
        if moved:
            self._logger.debug("ojs-adapters: moved %d parked retries to their queues", moved)
