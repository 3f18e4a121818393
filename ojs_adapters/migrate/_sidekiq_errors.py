"""What a ``sidekiq_retry_in`` block answers for one error class, in OJS terms.

``:kill`` and ``:discard`` for an error class become ``non_retryable_errors`` where they
end the job where ``on_exhaustion`` does, else a handler response code
(``JobError(type, code=...)``). A delay for one error class only is lossy: a policy
has one schedule; ``JobError(..., retry_after=seconds)`` keeps it as a minimum.

Names are kept as written (``ArgumentError``), and a Python exception's error type is
its module-qualified name (``app.errors.ArgumentError``; a built-in's bare name,
``ValueError``) unless its class sets ``ojs_error_type`` (``failure.error_type_of``):
the notes say so, and name the Python built-in usually meant (``RUBY_TO_PYTHON``).

>>> RUBY_TO_PYTHON["ArgumentError"]
('ValueError', 'TypeError')
"""

from __future__ import annotations

import builtins

from ojs_adapters.failure import HandlerCode
from ojs_adapters.migrate._arith import Formula
from ojs_adapters.migrate._common import Notes
from ojs_adapters.migrate._sidekiq_delay import Answer, RetryIn

#: Ruby's built-in errors a Sidekiq block names, and the Python built-ins usually raised
#: for the same fault (a Ruby name that is also a Python built-in matches as it is).
RUBY_TO_PYTHON: dict[str, tuple[str, ...]] = {
    "ArgumentError": ("ValueError", "TypeError"),
    "NoMethodError": ("AttributeError",),
    "RangeError": ("ValueError", "OverflowError"),
    "FrozenError": ("TypeError",),
    "Timeout::Error": ("TimeoutError",),
    "Errno::ECONNREFUSED": ("ConnectionRefusedError",),
    "Errno::ECONNRESET": ("ConnectionResetError",),
    "Errno::ETIMEDOUT": ("TimeoutError",),
    "Errno::ENOENT": ("FileNotFoundError",),
}


def per_error(retry_in: RetryIn, retries: int, exhaust: str, notes: Notes
              ) -> tuple[list[str], dict[str, HandlerCode]]:
    """Per-error answers: ``non_retryable_errors``, handler codes, and what is lost."""
    non_retryable: list[str] = []
    codes: dict[str, HandlerCode] = {}
    if retries == 0 and retry_in.per_error:
        notes.add("info", "sidekiq_retry_in", "per-error answers are never asked for: with no "
                  "retries the job ends at its first failure")
    for error, answer in retry_in.per_error.items() if retries else ():
        if answer not in ("kill", "discard"):
            if answer != retry_in.default:
                notes.add("lossy", "sidekiq_retry_in", f"{_said(answer)} for {error} only: an "
                          "OJS policy has one schedule for all errors, so the policy uses "
                          f"{_said(retry_in.default)} for {error} too"
                          + _minimum(error, answer))
            continue
        ends = "dead_letter" if answer == "kill" and exhaust == "dead_letter" else "discard"
        if ends == exhaust:
            non_retryable.append(error)
            continue
        codes[error] = "DEAD_LETTER" if ends == "dead_letter" else "DISCARD"
        notes.add("approximate", "sidekiq_retry_in",
                  f":{answer} for {error}: the handler must raise "
                  f"JobError({error!r}, code={codes[error]!r}); the policy alone sends "
                  f"non-retryable errors to on_exhaustion={exhaust!r}")
    if non_retryable:
        notes.add("info", "sidekiq_retry_in",
                  f"non_retryable_errors {', '.join(non_retryable)}: the block ends the job at "
                  f"once for these, where on_exhaustion {exhaust!r} puts it too. Names are kept "
                  "as written: handlers must raise these types, e.g. "
                  f"JobError({non_retryable[0]!r}, ...)" + _python_names(non_retryable))
    return non_retryable, codes


def _python_names(errors: list[str]) -> str:
    """How the Python side matches ``errors``, where a Python class would not by its name."""
    foreign = [e for e in errors if not hasattr(builtins, e)]
    if not foreign:
        return ""
    first = foreign[0]
    text = (f". A Python exception's error type is its module-qualified name "
            f"(app.errors.{first.rpartition('::')[2]}; a built-in's is bare, ValueError) "
            f"unless its class sets ojs_error_type, so a Python class named "
            f"{first.rpartition('::')[2]} does not match {first!r}; give it "
            f"ojs_error_type = {first!r}")
    meant = [f"{e} is usually {' or '.join(RUBY_TO_PYTHON[e])}" for e in foreign
             if e in RUBY_TO_PYTHON]
    if meant:
        text += (f". In Python, Ruby's {'; '.join(meant)}: add those to non_retryable_errors "
                 "if that is what the handlers raise")
    return text


def _minimum(error: str, answer: Answer) -> str:
    """The handler-side way to keep a per-error delay as a minimum (``retry_after``)."""
    if not isinstance(answer, Formula):
        return ""
    if not answer.uses_count and not answer.random:
        seconds = answer.value(0)
        if seconds is not None and seconds > 0:
            return (f". To wait at least {seconds:g} s after {error}, the handler can raise "
                    f"JobError({error!r}, ..., retry_after={seconds:g}): the delay is then "
                    f"the policy's or {seconds:g} s, whichever is longer")
    return (f". To wait at least {answer.text} after {error}, the handler can raise "
            f"JobError({error!r}, ..., retry_after=<that value>), count being "
            "current_job().attempt - 1: the delay is then the policy's or that, whichever "
            "is longer")


def _said(answer: Answer) -> str:
    if isinstance(answer, Formula):
        return f"the delay {answer.text}"
    return "Sidekiq's default delay" if answer is None else f":{answer}"
