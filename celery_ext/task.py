"""``OjsTask``: a Celery task base class that follows the OJS retry policy.

Use it as a base (``@app.task(base=OjsTask, retry_policy={...})``, or
``Celery(..., task_cls=OjsTask)``) and change nothing else. Every exception from the body
goes through ``ojs_adapters.decide`` (``_attempt``); the class sets Celery's options so
that a lost attempt is counted and the worker's main process handles dead letters and
hard time limits (``_request``). Celery's own retry options are refused (``_policy``);
eager runs are plain unless inside ``instant_retries()`` (``_eager``). The guide:
docs/getting-started/celery-redis.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, ClassVar, TypedDict

from celery import Task
from celery.exceptions import Ignore, Retry
from celery.utils.serialization import raise_with_context

from celery_ext._attempt import run_attempt
from celery_ext._current import CONTEXT_ATTRIBUTE, RUNNING, job_context
from celery_ext._eager import run_eager
from celery_ext._eager_warnings import warn_eager_once, warn_not_eager_once
from celery_ext._headers import HEADER, HeaderState
from celery_ext._parking import install as install_parking
from celery_ext._policy import reject_celery_retry_options, task_policy
from celery_ext._replace import SEAT_ATTRIBUTE, hand_over, prepare
from celery_ext._retry_send import SENDING
from celery_ext._self_retry import attempt_over, checked, retry_request
from celery_ext._started import take_over as take_over_track_started
from ojs_adapters import (
    JobContext,
    OjsValidationError,
    RetryPolicy,
    RetryPolicyDict,
    check_idempotency_key,
    new_idempotency_key,
)
from ojs_adapters.runtime._instant import active as instant_retries_active
from ojs_adapters.runtime.budget import check_dependency

#: Keys of Celery's publish retry policy (kombu ``Connection.ensure``), which is not an OJS policy.
PUBLISH_RETRY_KEYS = frozenset({"max_retries", "interval_start", "interval_step",
                                "interval_max", "retry_errors"})


class PublishRetryPolicyDict(TypedDict, total=False):
    """Celery's own ``apply_async(retry_policy=...)``: kombu's publish retry settings."""

    max_retries: int | None
    interval_start: float
    interval_step: float
    interval_max: float
    retry_errors: tuple[type[BaseException], ...] | None


class OjsTask(Task):  # type: ignore[misc]  # celery ships no type hints
    """A Celery task whose failures follow an OJS ``RetryPolicy``.

    Class options (also accepted by ``@app.task(base=OjsTask, ...)``):

    - ``retry_policy``: a partial OJS policy (a ``RetryPolicyDict``), merged over
      ``app.conf.ojs_default_retry_policy`` and the OJS defaults.
    - ``jitter_source``: zero-argument callable giving u in [0, 1) for the
      jitter multiplier 0.5 + u (default ``app.conf.ojs_jitter_source``, then
      ``random.random``); seed it to make countdowns reproducible. It is
      called inside the failing attempt, so ``celery.current_task.request.id``
      names the job (a per-job sample, as the conformance suite needs).
    - ``dead_letter_queue``: template of the dead-letter queue name
      (default ``app.conf.ojs_dead_letter_queue``, then ``{queue}.dead_letter``).
    - ``retry_budget``: the dependency whose retry budget this task's retries
      draw on (R-7; ``celery_ext._budgets``), e.g. ``"payments-api"``.

    Inside the body (``bind=True``), ``self.ojs`` is the running attempt's
    ``JobContext``: ``attempt``, ``errors`` and the job's ``idempotency_key``
    (R-6), a UUID v4 set when the job is first sent (or the caller's own,
    ``apply_async(..., idempotency_key="...")``), the same on every retry and
    dead-letter replay.

    >>> from celery import Celery
    >>> app = Celery("demo", broker="memory://")
    >>> @app.task(base=OjsTask, retry_policy={"max_attempts": 2})
    ... def add(x, y):
    ...     return x + y
    >>> add.policy().max_attempts
    2
    """

    retry_policy: ClassVar[RetryPolicyDict | RetryPolicy | None] = None
    jitter_source: ClassVar[Callable[[], float] | None] = None
    dead_letter_queue: ClassVar[str | None] = None
    retry_budget: ClassVar[str | None] = None

    acks_late = True  # with reject_on_worker_lost: a crashed attempt comes back, to be counted
    reject_on_worker_lost = True
    retry_on_worker_lost = False  # Celery would retry with its own delay
    max_retries = None  # each retry passes the policy's own limit
    # The last failure logs at ERROR with its traceback, as Celery logs any failure:
    # ``JobDiscarded``/``JobDeadLettered`` chain the body's exception (``_inputs``).
    throws: tuple[type[BaseException], ...] = ()
    Request = "celery_ext._request:OjsRequest"  # dead letters and hard limits: main process

    #: Celery's own tasks (``celery.chord_unlock``, ...) made from OjsTask by
    #: ``Celery(task_cls=OjsTask)``: they keep every native behaviour.
    native: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Validate the class's policy and options as the task is defined (RET-16)."""
        super().__init_subclass__(**kwargs)
        if str(cls.__dict__.get("name") or "").startswith("celery."):
            _make_native(cls)
            return
        reject_celery_retry_options(cls.__dict__)
        if cls.retry_budget is not None:
            check_dependency(cls.retry_budget)
        app = cls.__dict__.get("app")  # set by @app.task when it builds the class
        if hasattr(app, "conf"):
            task_policy(cls.retry_policy, app)
        else:
            RetryPolicy.from_dict(cls.retry_policy)

    @classmethod
    def on_bound(cls, app: Any) -> None:
        """Validate again once the app (and its default policy) is known; give its workers
        the mover of parked retries (``_parking``)."""
        if cls.native:
            return
        task_policy(cls.retry_policy, app)
        install_parking(app)
        take_over_track_started(cls)  # STARTED once admitted (_started)

    def policy(self, override: Mapping[str, Any] | None = None) -> RetryPolicy:
        """The effective policy: ``override`` over the task's over the app default."""
        base = task_policy(type(self).retry_policy, self.app)
        return RetryPolicy.from_dict(override, base=base) if override else base

    def apply_async(self, args: Any = None, kwargs: Any = None, task_id: Any = None,
                    producer: Any = None, link: Any = None, link_error: Any = None,
                    shadow: Any = None, *,
                    retry_policy: RetryPolicyDict | PublishRetryPolicyDict | None = None,
                    publish_retry_policy: Mapping[str, Any] | None = None,
                    idempotency_key: str | None = None, **options: Any) -> Any:
        """Send the task; ``retry_policy`` overrides the OJS policy for this call only.

        The override is validated here, in the caller (RET-16), and travels in
        the ``ojs`` header as the full effective policy, with the job's
        ``idempotency_key`` (the caller's, else a new UUID v4; a retry keeps its own).
        """
        if self.native or (task_id is not None and task_id == getattr(SENDING, "retry", None)):
            if retry_policy is not None:
                options["retry_policy"] = retry_policy
            return super().apply_async(args, kwargs, task_id, producer, link, link_error,
                                       shadow, **options)
        if _is_publish_retry_policy(retry_policy):
            # Celery's own meaning of the argument (kombu's publish retry): native parity.
            if publish_retry_policy is not None:
                raise OjsValidationError(
                    "retry_policy holds Celery's publish retry settings and "
                    "publish_retry_policy is given too: pass one of them",
                    code="INVALID_ARGS",
                    details={"field": "publish_retry_policy", "rule": "one publish policy"})
            publish_retry_policy, retry_policy = retry_policy, None
        if instant_retries_active() and not self.app.conf.task_always_eager:
            warn_not_eager_once(self.name)
        policy = self.policy(retry_policy)  # validates the task and app layers too
        headers = dict(options.get("headers") or {})
        state = HeaderState.from_headers(headers)
        if state.invalid is None:  # never rewrite a header the worker must refuse
            sent = state
            if retry_policy is not None:
                sent = replace(sent, policy=policy.to_dict())
            if idempotency_key is not None:
                sent = replace(sent, idempotency_key=check_idempotency_key(idempotency_key))
            elif sent.idempotency_key is None:
                sent = replace(sent, idempotency_key=new_idempotency_key())
            if sent is not state:
                headers[HEADER] = sent.encode()
                options["headers"] = headers
        if publish_retry_policy is not None:
            options["retry_policy"] = publish_retry_policy
        return super().apply_async(args, kwargs, task_id, producer, link, link_error,
                                   shadow, **options)

    @property
    def ojs(self) -> JobContext:
        """The running attempt: job id, attempt, history and idempotency key (R-6)."""
        request = self.request
        context = getattr(request, CONTEXT_ATTRIBUTE, None)
        if isinstance(context, JobContext) and context.job_id == request.id:
            return context
        return job_context(request)

    def on_replace(self, sig: Any) -> Any:
        """The replacement carries the job on, and once sent the record names it
        (``_replace``; a plain or eager call has no rounds)."""
        seat = getattr(self.request, SEAT_ATTRIBUTE, None)
        if seat is None or self.request.is_eager:
            return super().on_replace(sig)
        holder = prepare(seat, sig)
        try:
            return super().on_replace(sig)  # sends it, then raises Ignore
        except Ignore:  # sent: the record says so (a failed send fails the attempt)
            hand_over(seat, seat.fresh, sig, holder)
            raise

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        # Called from its own body (a recursive task): a plain call, as in Celery.
        if request.called_directly or self.native or getattr(RUNNING, "id", None) == request.id:
            return super().__call__(*args, **kwargs)
        if request.is_eager:
            if instant_retries_active():  # a test's instant_retries(): the policy, no waits
                return run_eager(self, args, kwargs)
            warn_eager_once(self.name)
            return self.run(*args, **kwargs)
        return run_attempt(self, args, kwargs)

    def retry(self, args: Any = None, kwargs: Any = None, exc: BaseException | None = None,
              throw: bool = True, eta: Any = None, countdown: float | None = None,
              max_retries: int | None = None, **options: Any) -> Any:
        """Ask for a retry from the task body: a RETRY failure that goes through the policy.

        ``countdown``/``eta`` give the least delay, ``max_retries`` this call's budget
        (``max_retries + 1`` attempts), ``args``/``kwargs`` the next attempt's arguments; a
        spent budget raises ``exc`` or ``MaxRetriesExceededError`` as Celery does. Other
        options raise ``RetryRefused`` (``_self_retry``). A direct or plain eager call runs
        the body once: it raises ``exc`` (or Celery's ``Retry``) as Celery's direct call does.
        """
        if self.native:
            return super().retry(args, kwargs, exc, throw, eta, countdown, max_retries,
                                 **options)
        request = self.request
        if request.called_directly or (request.is_eager and not instant_retries_active()):
            checked(self, args, kwargs, throw, eta, countdown, max_retries, options)
            raise_with_context(exc or Retry("Task can be retried", None))
        if getattr(RUNNING, "id", None) != request.id:
            raise attempt_over()  # on_failure, after_return...: the policy has decided
        raise retry_request(self, args, kwargs, exc, throw, eta, countdown, max_retries,
                            options)


def _make_native(cls: type[OjsTask]) -> None:
    """Give a Celery built-in task its native settings back, unless it sets them itself."""
    cls.native = True
    for name in ("acks_late", "reject_on_worker_lost", "retry_on_worker_lost", "max_retries",
                 "throws", "Request"):
        if name not in cls.__dict__:
            setattr(cls, name, getattr(Task, name))


def _is_publish_retry_policy(value: Any) -> bool:
    """Whether ``value`` is Celery's publish retry dict rather than an OJS policy.

    Only publish keys: Celery's. Both kinds of keys: an error naming the publish
    ones, since either reading would drop half of what the caller asked for.
    """
    if not isinstance(value, Mapping) or not value:
        return False
    publish = sorted(set(value) & PUBLISH_RETRY_KEYS)
    if not publish:
        return False
    if len(publish) < len(value):
        raise OjsValidationError(
            f"retry_policy mixes Celery's publish retry keys {publish} with OJS retry "
            "policy keys: pass the publish ones as publish_retry_policy=...",
            code="INVALID_RETRY_POLICY",
            details={"field": f"retry_policy.{publish[0]}",
                     "rule": "OJS policy and Celery publish retry keys are not mixed"})
    return True
