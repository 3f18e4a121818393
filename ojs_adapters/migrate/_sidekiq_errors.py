"""What a ``sidekiq_retry_in`` block answers for one error class, in OJS terms.

``:kill`` and ``:discard`` for an error class become ``non_retryable_errors`` where they
end the job where ``on_exhaustion`` does, else a handler response code
(``JobError(type, code=...)``). A delay for one error class only is lossy: a policy
has one schedule.
"""

from __future__ import annotations

from ojs_adapters.failure import HandlerCode
from ojs_adapters.migrate._arith import Formula
from ojs_adapters.migrate._common import Notes
from ojs_adapters.migrate._sidekiq_delay import Answer, RetryIn


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
                          f"{_said(retry_in.default)} for {error} too")
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
                  f"JobError({non_retryable[0]!r}, ...)")
    return non_retryable, codes


def _said(answer: Answer) -> str:
    if isinstance(answer, Formula):
        return f"the delay {answer.text}"
    return "Sidekiq's default delay" if answer is None else f":{answer}"
