"""The worker process of the memory benchmark: ``python -m bench.memory_worker FW VARIANT JOBS``.

Starts one variant's in-process worker (``celery_side`` or ``dramatiq_side``,
Redis), reads its idle RSS, queues ``JOBS`` jobs that fail once and then wait
``MEMORY_DELAY`` s in backoff, waits until every first attempt has failed (and
one more second for the retries to be taken up), and prints the process's
peak RSS as one JSON line. Then it exits at once, without cleanup: the parent
deletes the keys under the prefix printed on the first line.
"""

from __future__ import annotations

import json
import os
import sys
import time

from bench import env
from bench.workload import MEMORY_DELAY, Side, Variant


def _say(**data: object) -> None:
    print(json.dumps(data), flush=True)


def main(framework: str, variant: Variant, jobs: int) -> None:
    env.quiet_logging()
    side: Side
    if framework == "celery":
        from bench.celery_side import CelerySide

        side = CelerySide("redis", variants=(variant,))
    else:
        from bench.dramatiq_side import DramatiqSide

        side = DramatiqSide("redis", variants=(variant,))
    _say(prefix=getattr(side, "prefix", ""))
    side.journal.expect(jobs)
    side.start((variant,))
    time.sleep(1.0)
    idle = env.rss_kib()
    for i in range(jobs):
        side.send(variant, MEMORY_DELAY, f"m{i}", 1)
    deadline = time.monotonic() + 60 + jobs / 10
    while side.journal.failures < jobs:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{side.journal.failures} of {jobs} first attempts failed")
        time.sleep(0.1)
    time.sleep(1.0)
    _say(idle_kib=idle["VmRSS"], **env.rss_kib())
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))  # type: ignore[arg-type]
