"""Sidekiq ``sidekiq_options`` to an OJS RetryPolicy.

Sidekiq counts *retries* (``retry: 25`` is 26 attempts) and overloads ``retry``:
``true`` is the default count, ``false`` means no retry *and* no dead set, and
``0`` means no retry but straight to the dead set. ``dead: false`` keeps
exhausted jobs out of the dead set. ``retry_for`` (7.1.3+) limits retries by
time; from 8.1 it replaces the count.

The delay (``_sidekiq_delay``): Sidekiq's default formula gets the OJS
schedule closest to it retry by retry (``offset_formula``; section 3.4's
polynomial with coefficient 4.0 keeps the window only by retrying first after
half a second, where Sidekiq waits at least 15 s). A ``sidekiq_retry_in``
formula is fitted with the random term Sidekiq adds to it (since 6.2.2), and the
fit's error reported; ``:kill`` and ``:discard``
for an error class become ``non_retryable_errors`` (or a handler response
code where they end elsewhere). ``Migration.fidelity`` compares the schedules.

>>> m = from_sidekiq({"retry": 0})
>>> (m.policy.max_attempts, m.policy.on_exhaustion)
(1, 'dead_letter')
>>> from_sidekiq({"retry": False}).policy.on_exhaustion
'discard'
>>> p = from_sidekiq({"sidekiq_retry_in": "30 * (count + 1)"}, version="7.3").policy
>>> (p.backoff_strategy, p.initial_interval.total_seconds())  # + rand(10) * (count + 1)
('linear', 34.5)
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Literal

from ojs_adapters.migrate._arith import Formula
from ojs_adapters.migrate._common import (
    MAX_INTERVAL_S,
    MIN_INTERVAL_S,
    Notes,
    compared,
    get_bool,
    get_int,
    iso_seconds,
    judged,
    normalize,
    note_ignored,
    parse_version,
    policy_from,
)
from ojs_adapters.migrate._fidelity import Band
from ojs_adapters.migrate._fit import fit_schedule, schedule_fields
from ojs_adapters.migrate._model import Migration
from ojs_adapters.migrate._ruby_literals import Dynamic
from ojs_adapters.migrate._sidekiq_delay import (
    BLOCK_JITTER_SINCE,
    SIDEKIQ_JITTER,
    RetryIn,
    Version,
    block_delay,
    offset_formula,
    random_term,
    read_retry_in,
    seconds_of,
    sidekiq_band,
    source_band,
)
from ojs_adapters.migrate._sidekiq_errors import per_error

__all__ = ["DEFAULT_RETRIES", "RETRY_OPTIONS", "SIDEKIQ_JITTER", "from_sidekiq", "sidekiq_band"]

DIALECT = "sidekiq"
#: The version assumed when none is given.
LATEST = "8.1"
#: Retries for ``retry: true`` unless ``max_retries`` says otherwise.
DEFAULT_RETRIES = 25
RETRY_FOR_SINCE = (7, 1, 3)
RETRY_FOR_WINS_SINCE = (8, 1, 0)
#: Retries ``retry_for`` is checked against: past them a window counts as unbounded.
_WINDOW_LIMIT = 10_000

#: The options a translation reads; any other is left out with a note.
RETRY_OPTIONS = frozenset({"retry", "dead", "retry_for", "sidekiq_retry_in", "retry_in",
                           "max_retries"})


def from_sidekiq(options: Mapping[str, Any] | None, *, version: str | None = None,
                 name: str | None = None, origin: str | None = None) -> Migration:
    """Translate Sidekiq job options for Sidekiq ``version`` (default: the latest, 8.1).

    >>> m = from_sidekiq({"retry": 5, "dead": False}, version="7.3")
    >>> (m.policy.max_attempts, m.policy.on_exhaustion, m.policy.backoff_strategy)
    (6, 'discard', 'exponential')
    """
    opts = normalize(options, DIALECT)
    notes = Notes()
    ver = _version(version, notes)
    note_ignored(opts, RETRY_OPTIONS, notes)
    dynamic = [k for k in ("retry", "dead", "retry_for", "max_retries")
               if isinstance(opts.get(k), Dynamic)]
    if dynamic:
        for key in dynamic:
            notes.add("unsupported", key, f"{opts[key]} is not a literal; it was not evaluated, "
                      "so no policy is proposed (write the value, or translate by hand)")
        return Migration(DIALECT, None, tuple(notes), name=name, origin=origin, options=opts)

    dead = get_bool(opts, "dead", DIALECT, default=True)
    exhaust: Literal["dead_letter", "discard"] = "dead_letter" if dead else "discard"
    retry_in = read_retry_in(opts.get("sidekiq_retry_in", opts.get("retry_in")), ver, notes)
    by_time = opts.get("retry_for") is not None and ver >= RETRY_FOR_WINS_SINCE
    retries = _retries(opts, exhaust, notes, quiet=by_time)
    if retries is None:  # retry: false
        if opts.get("retry_for") is not None:
            notes.add("info", "retry_for", "no effect with retry: false")
        return _finish(opts, notes, 0, "discard", retry_in, ver, name, origin)
    retries = _apply_retry_for(opts, ver, retries, retry_in, notes)
    if retry_in.default in ("kill", "discard"):
        kept = "dead_letter" if retry_in.default == "kill" and dead else "discard"
        notes.add("info", "sidekiq_retry_in",
                  f":{retry_in.default} for every error: the job ends at its first failure "
                  + ("in the dead set" if kept == "dead_letter" else "and is dropped"))
        return _finish(opts, notes, 0, kept, retry_in, ver, name, origin)
    return _finish(opts, notes, retries, exhaust, retry_in, ver, name, origin)


def _finish(opts: dict[str, Any], notes: Notes, retries: int, exhaust: str, retry_in: RetryIn,
            ver: Version, name: str | None, origin: str | None) -> Migration:
    non_retryable, codes = per_error(retry_in, retries, exhaust, notes)
    fields: dict[str, Any] = {"max_attempts": retries + 1, "on_exhaustion": exhaust,
                              "non_retryable_errors": non_retryable}
    old: list[Band] = []
    if retries:
        formula = retry_in.default if isinstance(retry_in.default, Formula) else None
        shape, old = _schedule(formula, retries, ver, notes)
        fields.update(shape)
    policy = policy_from(fields)
    fidelity = judged(old, policy, notes)
    return Migration(DIALECT, policy, tuple(notes), fidelity, codes, name, origin, opts)


def _schedule(formula: Formula | None, retries: int, ver: Version, notes: Notes
              ) -> tuple[dict[str, Any], list[Band]]:
    """Policy fields for the delay and Sidekiq's own bands, one per compared retry."""
    count = compared(retries)
    own = [block_delay(formula, c) for c in range(count)]
    if formula is None or all(o is None for o in own):
        if formula is not None:
            notes.add("info", "sidekiq_retry_in", f"{formula.text} gives no positive delay, so "
                      "Sidekiq uses its default formula throughout")
        old = [sidekiq_band(c, ver) for c in range(count)]
        fields, why = offset_formula(old, retries, "Sidekiq")
        notes.add("approximate", "retry", "Sidekiq's delay " + why)
        notes.add("approximate", "retry",
                  "Sidekiq's random term is added seconds; OJS jitter multiplies the delay by "
                  "[0.5, 1.5), a wider spread in absolute terms")
        return fields, old
    # What Sidekiq waits on average: the block's delay plus, since 6.2.2, its random term
    # (and its default formula, random term included, where the block gives none).
    bands = [source_band(formula, c, ver) for c in range(count)]
    fit = fit_schedule([min(max(b.mean, MIN_INTERVAL_S), MAX_INTERVAL_S) for b in bands])
    said = f"the block's delay {formula.text}"
    if ver >= BLOCK_JITTER_SINCE:
        term, mean = random_term(ver)
        said += f" plus the {term} Sidekiq adds to it (since 6.2.2; {mean} s on average)"
    random = any(b.low < b.high for b in bands)
    if fit.exact and not random:
        notes.add("info", "sidekiq_retry_in", f"{said} is exactly {fit.describe()}")
    elif fit.exact:
        notes.add("approximate", "sidekiq_retry_in", f"{said} is random; its mean is exactly "
                  f"{fit.describe()}")
    else:
        notes.add("approximate", "sidekiq_retry_in", f"{said} has no exact OJS shape; its "
                  f"mean fitted as {fit.describe()}, the OJS schedule closest retry by retry "
                  f"({fit.error()})")
    fallback = [c + 1 for c, o in enumerate(own) if o is None]
    if fallback:
        shown = ", ".join(map(str, fallback[:5])) + (" ..." if len(fallback) > 5 else "")
        notes.add("info", "sidekiq_retry_in", f"no positive delay from the block before retry "
                  f"{shown}: Sidekiq uses its default formula there, and so does the fit")
    fields = schedule_fields(fit, retries, jitter=random)
    if random:
        first, new = bands[0], fit.initial
        why = " and ".join(w for w, on in (("the block's rand", formula.random),
                                           ("Sidekiq's random term", ver >= BLOCK_JITTER_SINCE
                                            or fallback)) if on)
        notes.add("approximate", "sidekiq_retry_in",
                  f"{why} {'spread' if ' and ' in why else 'spreads'} the retries: the "
                  "policy keeps a spread with jitter on, but "
                  f"OJS jitter multiplies the delay by [0.5, 1.5) (retry 1: {new * 0.5:.3g} to "
                  f"{new * 1.5:.3g} s where Sidekiq waits {first.low:g} to {first.high:g} s)")
    return fields, bands


def _version(version: str | None, notes: Notes) -> Version:
    if version is None:
        notes.add("info", "version", f"Sidekiq version not given; assumed {LATEST} "
                  "(the delay formula and retry_for rules depend on it)")
        version = LATEST
    return parse_version(version, DIALECT)


def _retries(opts: dict[str, Any], exhaust: str, notes: Notes, *, quiet: bool) -> int | None:
    """The retry count, or ``None`` for ``retry: false``; ``quiet`` when retry_for replaces it."""
    default = get_int(opts, "max_retries", DIALECT, default=DEFAULT_RETRIES, minimum=0)
    assert default is not None
    value = opts.get("retry")
    if value is None or value is True:
        if value is None and not quiet:
            whose = "the app's max_retries" if "max_retries" in opts else "Sidekiq's default"
            notes.add("info", "retry", f"not set: {whose} of {default} "
                      f"{'retry' if default == 1 else 'retries'} ({default + 1} "
                      f"{'attempt' if default == 0 else 'attempts'})")
        return default
    if value is False:
        notes.add("info", "retry", "false: no retry, and the failed job is not kept in the dead "
                  "set, so the policy discards it whatever 'dead' says")
        return None
    count = get_int(opts, "retry", DIALECT)
    assert count is not None
    if count <= 0 and not quiet:
        place = "goes to the dead set at once" if exhaust == "dead_letter" else "is dropped"
        notes.add("info", "retry", f"{count}: no retry; the failed job {place}")
    return max(count, 0)


def _apply_retry_for(opts: dict[str, Any], ver: Version, retries: int, retry_in: RetryIn,
                     notes: Notes) -> int:
    if opts.get("retry_for") is None:
        return retries
    window = seconds_of(opts["retry_for"], "retry_for")
    if ver < RETRY_FOR_SINCE:
        notes.add("lossy", "retry_for", "Sidekiq before 7.1.3 ignores retry_for; so does the "
                  "policy")
        return retries
    formula = retry_in.default if isinstance(retry_in.default, Formula) else None
    bands = list(_bands(formula, ver))
    fit = {key: _fit_window(bands, window, key) for key in ("mean", "low", "high")}
    counted = fit["mean"]
    spread = (f" (between {fit['high']} and {fit['low']} depending on Sidekiq's random term)"
              if fit["high"] != fit["low"] else "")
    if ver >= RETRY_FOR_WINS_SINCE:
        if "retry" in opts and opts["retry"] is not True:
            notes.add("info", "retry", "since Sidekiq 8.1 retry_for wins: the retry count is "
                      "ignored")
        result = counted
    else:
        result = min(retries, counted)
    notes.add("approximate", "retry_for",
              f"OJS limits attempts, not time: a window of {iso_seconds(window)} holds "
              f"{counted} retries of the expected Sidekiq schedule{spread}"
              + ("" if result == counted else f"; the retry count {retries} ends it first"))
    return result


def _bands(formula: Formula | None, ver: Version) -> Iterator[Band]:
    for count in range(_WINDOW_LIMIT):
        yield source_band(formula, count, ver)


def _fit_window(bands: list[Band], window: float, key: str) -> int:
    """Retries Sidekiq makes before ``failed_at + retry_for`` passes (at least one)."""
    elapsed, retries = 0.0, 0
    for band in bands:
        if elapsed > window:
            break
        retries += 1
        elapsed += getattr(band, key)
    return retries
