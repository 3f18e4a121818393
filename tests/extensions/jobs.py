"""The jobs of the extension tests, written once and run by both frameworks' workers.

Worker subprocesses (``celery_worker``, ``dramatiq_worker``) build their app from
``Config`` (JSON in ``CONFIG_ENV``) and declare one task/actor per job below. Each
run appends ``{"job", "n", "attempt", "key", "pid", "at"}`` to the Redis list
``<ns>:runs`` so the test process sees every attempt in every worker.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from typing import Any

import redis

from ojs_adapters import JobContext, JobError

#: Environment variable carrying the worker's ``Config``.
CONFIG_ENV = "OJS_EXTENSION_TESTS"
#: Share of executions the test budget allows as retries, and its floor.
BUDGET_SHARE, BUDGET_MINIMUM = 0.2, 0

#: Each job's policy (partial; merged over the OJS defaults).
POLICIES: dict[str, dict[str, Any]] = {
    # fails until healed; two attempts, then the dead-letter queue
    "keyed": {"max_attempts": 2, "initial_interval": "PT0.1S", "jitter": False,
              "on_exhaustion": "dead_letter"},
    # always fails; 0.4 s apart, but the whole job may last 1 s
    "lasting": {"max_attempts": 10, "initial_interval": "PT0.4S", "backoff_strategy": "none",
                "jitter": False, "max_duration": "PT1S"},
    # asks for 1.5 s on attempt 1 although the policy says 0.05 s
    "throttled": {"max_attempts": 3, "initial_interval": "PT0.05S", "jitter": False},
    # asks for 5 s with only 2 s of max_duration: exhausts at once
    "overdue": {"max_attempts": 3, "initial_interval": "PT0.05S", "jitter": False,
                "max_duration": "PT2S"},
    # draws its retries from the shared budget of one dependency
    "limited": {"max_attempts": 2, "initial_interval": "PT0.05S", "jitter": False},
}


@dataclass(frozen=True)
class Config:
    """What a worker process needs: Redis URL, namespace, queue, budget dependency."""

    redis_url: str
    ns: str
    queue: str
    dependency: str

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_env(cls) -> Config | None:
        raw = os.environ.get(CONFIG_ENV)
        return cls(**json.loads(raw)) if raw else None


class Runs:
    """Writes and reads the run log of one namespace."""

    def __init__(self, config: Config) -> None:
        self.client = redis.Redis.from_url(config.redis_url)
        self.ns = config.ns

    def add(self, job: str, n: int, context: JobContext) -> None:
        self.client.rpush(f"{self.ns}:runs", json.dumps({
            "job": job, "n": n, "id": context.job_id, "attempt": context.attempt,
            "key": context.idempotency_key, "replays": context.replay_count,
            "pid": os.getpid(), "at": time.time()}))

    def all(self) -> list[dict[str, Any]]:
        return [json.loads(x) for x in self.client.lrange(f"{self.ns}:runs", 0, -1)]

    def healed(self) -> bool:
        return bool(self.client.exists(f"{self.ns}:healed"))

    def heal(self) -> None:
        self.client.set(f"{self.ns}:healed", 1, ex=600)

    def ready(self, name: str) -> None:
        self.client.set(f"{self.ns}:ready:{name}", os.getpid(), ex=600)


def body(job: str, n: int, context: JobContext | None, runs: Runs) -> str:
    """What job ``job`` does on one attempt (the same in both frameworks)."""
    assert context is not None, "no JobContext inside an attempt"
    runs.add(job, n, context)
    if job == "keyed" and not runs.healed():
        raise JobError("upstream.Down", f"job {n} attempt {context.attempt}")
    if job == "lasting":
        raise RuntimeError("still failing")
    if job == "throttled" and context.attempt == 1:
        raise JobError("rate.Limited", "slow down", retry_after=1.5)
    if job == "overdue":
        raise JobError("rate.Limited", "come back in 5 s", retry_after=5.0)
    if job == "limited" and n < 0:  # a negative n always fails
        raise ConnectionError("payments-api unreachable")
    return "ok"
