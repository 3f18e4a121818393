"""What ``dlq`` and its broker stores (``_dlq_redis``, ``_dlq_kombu``) share.

The queue names (``dead_letter_queues``: each dead-letter queue and its original),
the ``DeadLetter`` a dead task message stands for (``dead_letter_of``), the headers
of its replayed copy (``replay_headers``), and where a replay is stamped on the job
record (``JobRecords``). See ``dlq`` for how replay works.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from kombu.serialization import loads as _untyped_loads
from kombu.serialization import prepare_accept_content as _untyped_accept

from celery_ext._conf import setting
from celery_ext._deadletter import DEAD_LETTER_HEADER
from celery_ext._handoff import TOKEN_HEADER
from celery_ext._headers import HEADER, HeaderState
from celery_ext._routing import (
    DEAD_LETTER_SETTING,
    DEFAULT_DEAD_LETTER_QUEUE,
    dead_letter_queue_name,
)
from celery_ext.records import RecordStore
from ojs_adapters import JobRecord, OjsValidationError
from ojs_adapters.runtime.dlq import (
    REPLAY_HEADER,
    DeadLetter,
    DeadLetterQueueGiven,
    ReplayMark,
    closed_round,
    last_error,
    originals,
    replay_info,
)
from ojs_adapters.runtime.dlq import replayed_record as _replayed_record
from ojs_adapters.runtime.handoff import HEADER_NAMES

#: kombu's deserializer (untyped upstream).
_loads: Callable[..., Any] = _untyped_loads
_accept: Callable[[Any], Any] = _untyped_accept
#: Headers of one dead-lettering, one hand-off (the last failure's ``x-ojs-*``, the
#: copy's token) or one delivery, dropped from a replayed copy.
_DROPPED_HEADERS = frozenset({DEAD_LETTER_HEADER, *HEADER_NAMES, TOKEN_HEADER,
                              "redelivered", "x-death", "x-first-death-exchange",
                              "x-first-death-queue", "x-first-death-reason"})


def dead_letter_templates(app: Any) -> list[str]:
    """The app's dead-letter queue name templates: its setting (or the default), tasks' own."""
    found = [setting(app, DEAD_LETTER_SETTING) or DEFAULT_DEAD_LETTER_QUEUE]
    for task in app.tasks.values():
        own = getattr(type(task), "dead_letter_queue", None)
        if own and own not in found:
            found.append(own)
    return found


def app_queues(app: Any) -> set[str]:
    """The queues ``app``'s workers take from: its queue table, and each task's own or routed queue.

    The default queue counts only when it is in the table (it is unless ``task_queues``
    leaves it out): a task merely falling back to it is not a sign that a worker reads it.
    """
    names = {str(q) for q in app.amqp.queues}
    for name, task in app.tasks.items():
        queue = getattr(task, "queue", None)
        if not queue:
            try:
                queue = app.amqp.router.route({}, name, (), {}, task).get("queue")
            except Exception:  # a user router that needs real arguments: nothing to learn
                continue
        queue = str(getattr(queue, "name", queue or ""))
        if queue and queue != app.conf.task_default_queue:
            names.add(queue)
    return names


def dead_letter_queues(app: Any, queues: Sequence[str]) -> dict[str, str]:
    """``{dead-letter queue: original queue}`` for the app's queues and ``queues``."""
    templates = dead_letter_templates(app)
    names = app_queues(app) | set(queues)
    names -= set(originals(names, templates))  # a dead-letter queue has none of its own
    # sorted: a name several queues share maps to the same one on every run
    return {dead_letter_queue_name(q, t): q for t in reversed(templates) for q in sorted(names)}


def refuse_dead_letter_queues(queues: Sequence[str], templates: Sequence[str]) -> None:
    """``DeadLetterQueueGiven`` for the first of ``queues`` that ``dead_letter_queue_name``
    gives under one of ``templates`` (a fixed one: every queue's); the rest are originals."""
    for name in queues:
        for template in templates:
            if "{queue}" not in template:
                if name == template:
                    raise DeadLetterQueueGiven(name, None)
                continue
            prefix, _, suffix = template.partition("{queue}")
            core = name[len(prefix):len(name) - len(suffix)]
            if core and dead_letter_queue_name(core, template) == name:
                raise DeadLetterQueueGiven(name, core)


def shared(dead: str, original: str, templates: Sequence[str]) -> bool:
    """Whether dead-letter queue ``dead`` may hold other queues' dead letters than
    ``original``'s: it is not ``original``'s own name under a template with ``{queue}``
    (``ojs_dead_letter_queue="dead_letters"`` gathers every queue's). Its letters then go
    back to the queue each one names, and a purge of one queue takes only that queue's."""
    if any("{queue}" not in t and t == dead for t in templates):
        return True  # a fixed name, though it may look like a queue's own
    return not any("{queue}" in t and dead_letter_queue_name(original, t) == dead
                   for t in templates)


def dead_letter_of(*, body: bytes | str, content_type: str, content_encoding: str,
                   headers: Mapping[str, Any], properties: Mapping[str, Any], queue: str,
                   accept: Any = None) -> DeadLetter:
    """The ``DeadLetter`` a dead Celery task message stands for.

    Its ``key`` is the task id plus a digest of the body and the dead-letter
    header: the same on every read, different for each dead-lettering.
    """
    if isinstance(body, str):  # py-amqp decodes bodies that name their encoding
        body = body.encode(content_encoding or "utf-8")
    raw = headers.get(DEAD_LETTER_HEADER)
    record = JobRecord.from_dict(json.loads(raw)) if raw else None
    state = HeaderState.from_headers(headers)
    history = record.errors if record else state.errors
    error_type, error_code = last_error(history)
    args, kwargs, embed = _decode(body, content_type, content_encoding, accept)
    replay = replay_info(headers)
    stamp = (record.updated_at if record else None) or (history[-1].occurred_at if history
                                                        else None)
    digest = hashlib.sha1(body + str(raw).encode(), usedforsecurity=False).hexdigest()[:16]
    return DeadLetter(
        id=str(headers.get("id")), queue=record.queue if record and record.queue else queue,
        task_type=str(headers.get("task")), error_type=error_type, error_code=error_code,
        dead_lettered_at=_parse(stamp), attempt=record.attempt if record else state.attempt,
        history=history,
        payload={"args": args, "kwargs": kwargs, "embed": embed,
                 "headers": {k: v for k, v in headers.items() if k != DEAD_LETTER_HEADER},
                 "properties": dict(properties), "content_type": content_type},
        replay_count=int(replay.get("replay_count", 0)),
        last_replayed_at=replay.get("last_replayed_at"), key=f"{headers.get('id')}:{digest}")


def replay_headers(headers: Mapping[str, Any], mark: ReplayMark) -> dict[str, Any]:
    """The headers of a replayed copy: attempt 1, full history (its dead round stamped),
    Celery retries reset, mark set."""
    raw = headers.get(DEAD_LETTER_HEADER)
    record = JobRecord.from_dict(json.loads(raw)) if raw else None
    state = HeaderState.from_headers(headers)
    key = state.idempotency_key or (record.extra.get("idempotency_key") if record else None)
    errors = closed_round(record.errors if record else state.errors, mark.replay_count - 1)
    fresh = HeaderState(attempt=1, errors=errors, policy=state.policy,
                        idempotency_key=key)  # the same key
    out = {k: v for k, v in headers.items() if k not in _DROPPED_HEADERS}
    # ``expires`` goes with ``eta``: a job replayed after it would be revoked unrun.
    out.update({HEADER: fresh.encode(), REPLAY_HEADER: json.dumps(mark.to_dict()),
                "retries": 0, "eta": None, "expires": None})
    return out


class JobRecords:
    """Stamps replays on job records in the app's result backend.

    ``reachable=False`` (an app built from a broker URL alone, whose backend may not
    be the workers') makes a replay refuse: a worker finding the job's terminal
    record at attempt 1 would drop the replayed copy as a duplicate.
    """

    def __init__(self, app: Any, *, reachable: bool = True) -> None:
        self.store = RecordStore(app.backend)
        self.reachable = reachable

    def mark(self, letter: DeadLetter, mark: ReplayMark) -> None:
        """Reset the record for a replay (before the move: see the module docstring)."""
        if not self.reachable:
            raise OjsValidationError(
                "replay needs the workers' job records: pass --app module[:app] (the "
                "workers' app), or --option backend=URL (their result backend)",
                code="INVALID_ARGS",
                details={"field": "app", "rule": "the workers' job records are reachable"})
        record = self.store.load(letter.id) or JobRecord(
            id=letter.id, type=letter.task_type, queue=letter.queue, max_attempts=letter.attempt,
            attempt=letter.attempt, errors=letter.history)
        self.store.save(_replayed_record(record, mark))


def _decode(body: bytes, content_type: str, content_encoding: str,
            accept: Any) -> tuple[Any, Any, Any]:
    try:
        decoded = _loads(body, content_type, content_encoding,
                         accept=_accept(accept) if accept is not None else None)
    except Exception:  # an unreadable body is still a dead letter: show its bytes
        return None, None, {"undecodable_body": body[:256].decode("latin-1")}
    if isinstance(decoded, (list, tuple)) and len(decoded) == 3:
        return decoded[0], decoded[1], decoded[2]
    return decoded, None, None  # task protocol 1


def _parse(stamp: str | None) -> datetime:
    if not stamp:
        return datetime.now(timezone.utc)
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))
