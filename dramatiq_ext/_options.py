"""Where a message's retry policy comes from, and what Dramatiq's own retry options become.

Three partial policies merge (RET-10): the message option ``retry_policy`` over the actor
option ``retry_policy`` over the middleware's ``default_policy``. Dramatiq's ``Retries``
options on an actor (``max_retries``, ``min_backoff``, ``max_backoff``, ``throws``) are
translated into the policy as ``ojs-retry migrate --from dramatiq`` does (``_native``) and
keep their native outcome; ``retry_when`` and ``on_retry_exhausted`` are refused.
The rules: docs/getting-started/dramatiq-redis.md.
Errors are ``InvalidRetryPolicy``, also a Dramatiq ``MiddlewareError``: ``emit_before``
logs and swallows any other exception a hook raises, and this one must reach the caller.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dramatiq.middleware import MiddlewareError

from dramatiq_ext._native import NATIVE_FIELDS, STOCK, NativeDefaults, native_policy_fields
from ojs_adapters import OjsValidationError, RetryPolicy
from ojs_adapters.failure import error_type_of
from ojs_adapters.keys import check_idempotency_key, new_idempotency_key
from ojs_adapters.runtime.budget import check_dependency

#: The actor and message option that carries an OJS retry policy.
POLICY_OPTION = "retry_policy"
#: The actor option naming the dependency whose retry budget its retries use (R-7).
BUDGET_OPTION = "retry_budget"
#: The message option holding the job's idempotency key (R-6).
KEY_OPTION = "idempotency_key"
#: Dramatiq ``Retries`` actor options translated into the actor's policy.
TRANSLATED_OPTIONS = frozenset({"max_retries", "min_backoff", "max_backoff", "throws"})
#: What native Dramatiq does with a message it stops retrying (``message.fail()``: ``.XQ``).
NATIVE_EXHAUSTION = "dead_letter"
#: Dramatiq ``Retries`` options with no OJS meaning, and what to use instead.
REJECTED_OPTIONS: Mapping[str, str] = {
    "retry_when": "a predicate cannot be expressed as an OJS policy; raise "
                  "JobError(..., code='DISCARD') or list the error type in non_retryable_errors",
    "on_retry_exhausted": "use on_exhaustion: 'dead_letter' and read the .XQ queue, "
                          "or an on_failure callback",
}


class InvalidRetryPolicy(OjsValidationError, MiddlewareError):
    """A retry policy or retry option that ``OjsRetries`` refuses (RET-16).

    Raised where the actor is declared or the message sent. Catch it as
    ``OjsValidationError``; ``.details["field"]`` names the offending field.

    >>> import dramatiq
    >>> from dramatiq.brokers.stub import StubBroker
    >>> from dramatiq_ext import OjsRetries
    >>> broker = StubBroker(); broker.add_middleware(OjsRetries())
    >>> try:
    ...     dramatiq.actor(lambda: None, actor_name="bad", broker=broker,
    ...                    retry_policy={"max_attempts": -1})
    ... except OjsValidationError as exc:
    ...     print(exc.details["field"])
    max_attempts
    """


def policy_option(value: Any, *, base: RetryPolicy, where: str) -> RetryPolicy:
    """``value`` (a mapping, a ``RetryPolicy`` or ``None``) merged over ``base``, validated."""
    if value is None:
        return base
    try:
        return RetryPolicy.from_dict(value, base=base)
    except OjsValidationError as exc:
        raise _invalid(exc, where) from None


def actor_policy(options: Mapping[str, Any], default: RetryPolicy, *, actor: str,
                 default_stated: Mapping[str, Any] | None = None,
                 native: NativeDefaults = STOCK) -> RetryPolicy:
    """The policy an actor's options give, over ``default``; raises ``InvalidRetryPolicy``.

    An actor stating a Dramatiq retry option keeps Dramatiq's outcome for what it leaves
    out (DESIGN.md "Native parity"): ``native``'s settings (the replaced ``Retries``'),
    translated as ``ojs-retry migrate --from dramatiq`` does (``_native``). With
    customised ``native`` settings every actor gets them, as natively. Precedence: the
    actor's ``retry_policy``, its native options, the fields ``default_stated`` (the
    middleware's ``default_policy``) states, ``native``'s settings, the OJS defaults.
    """
    for name, hint in REJECTED_OPTIONS.items():
        if name in options:
            raise _rejected(name, f"actor {actor!r} sets Dramatiq's {name!r}: {hint}")
    given = options.get(POLICY_OPTION)
    if isinstance(given, RetryPolicy):
        given = given.to_dict()
    if given is not None and not isinstance(given, Mapping):
        return policy_option(given, base=default, where=f"actor {actor!r}")  # raises
    own: Mapping[str, Any] = given or {}
    throws = _check_native(options, own, actor=actor)
    merged: dict[str, Any] = {}
    stated = native_options(options)
    if stated or native.custom:
        fields = native_policy_fields(options, native)
        overridden = set(default_stated or {}) - {
            field for field, source in NATIVE_FIELDS.items() if source in stated}
        merged = {k: v for k, v in fields.items() if k not in overridden}
    merged.update(own)
    if throws:
        prior = own.get("non_retryable_errors", [])
        if isinstance(prior, (list, tuple)):  # anything else is left for the schema to refuse
            merged["non_retryable_errors"] = [*prior, *throws]
    return policy_option(merged or None, base=default, where=f"actor {actor!r}")


def native_options(options: Mapping[str, Any]) -> list[str]:
    """The Dramatiq retry options an actor states (an empty ``throws`` states nothing)."""
    return [name for name in sorted(TRANSLATED_OPTIONS)
            if name in options and (name != "throws" or options[name])]


def native_conflict(options: Mapping[str, Any], *, actor: str,
                    default_exhaustion: str | None = None) -> str | None:
    """Why an actor's native options do not dead-letter, when an OJS policy overrides them.

    ``None`` when the actor states no native option, or nothing says other than
    ``"dead_letter"``. Call it on options ``actor_policy`` accepted.

    >>> print(native_conflict({"max_retries": 2, "retry_policy": {"on_exhaustion": "discard"}},
    ...                       actor="charge")[:51])
    Actor 'charge' states Dramatiq's max_retries, which
    >>> native_conflict({"max_retries": 2}, actor="charge") is None
    True
    """
    native = native_options(options)
    given = options.get(POLICY_OPTION)
    if isinstance(given, RetryPolicy):
        given = given.to_dict()
    own = given.get("on_exhaustion") if isinstance(given, Mapping) else None
    chosen, where = ((own, "its retry_policy") if own is not None
                     else (default_exhaustion, "OjsRetries' default_policy"))
    if not native or chosen is None or chosen == NATIVE_EXHAUSTION:
        return None
    return (f"Actor {actor!r} states Dramatiq's {', '.join(native)}, which natively puts an "
            f"exhausted message (and a throws error) on <queue>.XQ, but {where} says "
            f"on_exhaustion {chosen!r}: OJS wins, nothing of it reaches .XQ. To silence this, "
            "state the policy in OJS terms only (max_attempts, initial_interval, "
            "max_interval, non_retryable_errors in retry_policy).")


def check_budget_option(options: Mapping[str, Any], *, actor: str) -> str | None:
    """The actor's ``retry_budget`` dependency name, validated (``None`` when not set)."""
    value = options.get(BUDGET_OPTION)
    if value is None:
        return None
    try:
        return check_dependency(value)
    except OjsValidationError as exc:
        raise _invalid(exc, f"actor {actor!r}") from None


def ensure_idempotency_key(options: dict[str, Any], *, actor: str) -> None:
    """Give a message its idempotency key: the sender's own, validated, or a new UUID v4."""
    value = options.get(KEY_OPTION)
    if value is None:
        options[KEY_OPTION] = new_idempotency_key()
        return
    try:
        check_idempotency_key(value)
    except OjsValidationError as exc:
        raise _invalid(exc, f"message for {actor!r}") from None


def check_message_options(options: dict[str, Any], *, actor: str) -> None:
    """Validate a message's own ``retry_policy``; refuse Dramatiq's retry options on it.

    A ``RetryPolicy`` object is replaced by its ``to_dict()`` so the message stays JSON.
    """
    for name in sorted(TRANSLATED_OPTIONS | set(REJECTED_OPTIONS)):
        if name in options:
            raise _rejected(name, f"message for {actor!r} sets Dramatiq's {name!r}; "
                                  f"pass retry_policy={{...}} instead")
    value = options.get(POLICY_OPTION)
    if isinstance(value, RetryPolicy):
        options[POLICY_OPTION] = value.to_dict()
    elif value is not None:
        policy_option(value, base=RetryPolicy(), where=f"message for {actor!r}")


def _check_native(options: Mapping[str, Any], own: Mapping[str, Any], *,
                  actor: str) -> list[str]:
    """Validate the actor's Dramatiq retry options; the error types its ``throws`` names."""
    if "max_retries" in options:
        retries = options["max_retries"]
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise _rejected("max_retries", f"actor {actor!r}: max_retries must be an int >= 0")
        if "max_attempts" in own:
            raise _rejected("max_retries", f"actor {actor!r} gives both max_retries and "
                                           "retry_policy.max_attempts; keep max_attempts")
    for name in ("min_backoff", "max_backoff"):
        if name in options:
            millis = options[name]
            if isinstance(millis, bool) or not isinstance(millis, (int, float)) or millis <= 0:
                raise _rejected(name, f"actor {actor!r}: {name} must be milliseconds > 0")
    if not options.get("throws"):
        return []
    throws = options["throws"]
    classes = throws if isinstance(throws, tuple) else (throws,)
    if not all(isinstance(k, type) and issubclass(k, BaseException) for k in classes):
        raise _rejected("throws", f"actor {actor!r}: throws must be exception classes")
    return [error_type_of(k) for k in classes]


def _invalid(exc: OjsValidationError, where: str) -> InvalidRetryPolicy:
    return InvalidRetryPolicy(f"{where}: {exc.message}", code=exc.code, details=exc.details)


def _rejected(name: str, message: str) -> InvalidRetryPolicy:
    return InvalidRetryPolicy(message, code="INVALID_RETRY_POLICY",
                              details={"field": name, "rule": "not supported by OjsRetries"})
