"""The fitting and fidelity core of migration (issue 16): properties, then examples.

A fit keeps the total retry window of its targets and finds any shape OJS can
say exactly (ojs-retry section 3, Appendix A); a ``Fidelity`` is faithful when
no retry is off by more than the tolerance and the window holds. The Ruby
arithmetic of ``sidekiq_retry_in`` follows Ruby's integer rules.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ojs_adapters.backoff import raw_delay
from ojs_adapters.migrate import Band, Fidelity, FidelityRow, Migration, Note
from ojs_adapters.migrate._arith import FormulaError, parse_formula
from ojs_adapters.migrate._common import MIN_INTERVAL_S
from ojs_adapters.migrate._fidelity import RETRY_TOLERANCE, SLACK_S, WINDOW_TOLERANCE
from ojs_adapters.migrate._fit import _closest, fit_schedule, fit_shape
from ojs_adapters.migrate._ruby_block import read_block
from ojs_adapters.policy import RetryPolicy

delays = st.lists(st.floats(0.05, 1e6), min_size=1, max_size=30)


@settings(max_examples=60, deadline=None)
@given(targets=delays, strategy=st.sampled_from(["none", "linear", "exponential",
                                                 "polynomial"]),
       coefficient=st.floats(1.0, 4.0))
def test_a_fit_keeps_the_total_window(targets: list[float], strategy: str,
                                      coefficient: float) -> None:
    fit = fit_shape(targets, strategy, coefficient)  # type: ignore[arg-type]
    # Only the rounding of the initial interval (three significant digits) moves the window,
    # unless the interval is the shortest one a migration writes.
    assume(fit.initial > MIN_INTERVAL_S)
    assert fit.window == pytest.approx(1.0, abs=0.005)


@settings(max_examples=40, deadline=None)
@given(strategy=st.sampled_from(["none", "linear", "exponential", "polynomial"]),
       initial_ms=st.integers(100, 100_000), hundredths=st.integers(100, 400),
       retries=st.integers(2, 25))
def test_a_shape_ojs_can_say_is_found_exactly(strategy: str, initial_ms: int,
                                              hundredths: int, retries: int) -> None:
    coefficient = hundredths / 100 if strategy in ("exponential", "polynomial") else 1.0
    targets = [raw_delay(strategy, n, initial_ms / 1000, coefficient)  # type: ignore[arg-type]
               for n in range(1, retries + 1)]
    fit = fit_schedule(targets)
    assert fit.exact, fit
    assert fit.initial == pytest.approx(initial_ms / 1000, rel=1e-3)


@settings(max_examples=40, deadline=None)
@given(targets=delays, strategy=st.sampled_from(["none", "linear", "exponential",
                                                 "polynomial"]),
       coefficient=st.floats(1.0, 4.0))
def test_the_closest_fit_is_no_farther_than_any_window_keeping_one(
        targets: list[float], strategy: str, coefficient: float) -> None:
    """Among the schedules within tolerance, the fit's measure (the worst per-retry log
    ratio, a sooner retry counting SOONER_WEIGHT times) is never worse than that of a
    shape scaled to keep the window (what the fit was before), beyond the 1% a simpler
    shape may give away."""
    fit = fit_schedule(targets)
    other = fit_shape(targets, strategy, round(coefficient, 2))  # type: ignore[arg-type]
    if other.within:
        assert fit.within
        assert fit.cost <= other.cost + math.log(1.01) + 1e-6


@settings(max_examples=40, deadline=None)
@given(targets=delays, strategy=st.sampled_from(["exponential", "polynomial"]),
       hundredths=st.integers(100, 800))
def test_no_schedule_within_tolerance_is_closer_than_the_fit(
        targets: list[float], strategy: str, hundredths: int) -> None:
    """Any coefficient at the fit's step, with its closest initial interval: if that is
    within tolerance, the fit is too and no farther (beyond the 1% a simpler shape may
    give away). A range within tolerance can be one step wide."""
    fit = fit_schedule(targets)
    other = _closest(targets, strategy, hundredths / 100, True)  # type: ignore[arg-type]
    if other.within:
        assert fit.within
        assert fit.cost <= other.cost + math.log(1.01) + 1e-6


@settings(max_examples=60, deadline=None)
@given(old=st.lists(st.floats(SLACK_S * 4, 1e6), min_size=1, max_size=20),
       factor=st.floats(0.2, 5.0))
def test_a_scaled_schedule_is_faithful_exactly_within_tolerance(old: list[float],
                                                                factor: float) -> None:
    off = abs(math.log(factor))
    gap = sum(old) * abs(factor - 1)
    assume(min(abs(off - math.log(WINDOW_TOLERANCE)), abs(off - math.log(RETRY_TOLERANCE)),
               abs(gap - SLACK_S)) > 1e-6)
    rows = tuple(FidelityRow(n, Band(d, d, d), Band(d * factor, d * factor, d * factor))
                 for n, d in enumerate(old, start=1))
    fidelity = Fidelity(rows)
    assert fidelity.window_ratio == pytest.approx(factor)
    assert fidelity.window_ok == (off <= math.log(WINDOW_TOLERANCE) or gap <= SLACK_S)
    strays = off > math.log(RETRY_TOLERANCE) and max(old) * abs(factor - 1) > SLACK_S
    assert bool(fidelity.strays) == strays
    assert fidelity.faithful == (fidelity.window_ok and not strays)


def test_short_delays_are_not_judged_by_ratio() -> None:
    """0.8 s for 19.5 s is ratio 0.04 but 19 s: under SLACK_S, not a stray; it is hurried."""
    row = FidelityRow(1, Band(15, 24, 19.5), Band(0.41, 1.23, 0.82))
    assert Fidelity((row,)).strays == ()
    assert Fidelity((row,)).faithful  # the window differs by 19 s only
    assert Fidelity((row,)).hurried == (row,)


@settings(max_examples=80, deadline=None)
@given(old=st.floats(0.5, 600.0), factor=st.floats(0.01, 10.0))
def test_a_retry_much_sooner_is_hurried_whatever_the_seconds(old: float, factor: float) -> None:
    """The slack excuses a short delay that comes later, not one that comes much sooner:
    a retry more than RETRY_TOLERANCE sooner is a stray past SLACK_S, else hurried, and
    hurried is not lossy (the schedule stays faithful) but the verdict is approximate."""
    new = old * factor
    assume(abs(factor * RETRY_TOLERANCE - 1) > 1e-9 and abs(abs(new - old) - SLACK_S) > 1e-9)
    row = FidelityRow(1, Band(old, old, old), Band(new, new, new))
    fidelity = Fidelity((row,))
    sooner = factor < 1 / RETRY_TOLERANCE
    assert bool(fidelity.hurried) == (sooner and old - new <= SLACK_S)
    assert bool(fidelity.strays) == (abs(math.log(factor)) > math.log(RETRY_TOLERANCE)
                                     and abs(new - old) > SLACK_S)
    policy = RetryPolicy.from_dict({"max_attempts": 2, "initial_interval": "PT1S"})
    m = Migration("sidekiq", policy, (Note("approximate", None, "x"),), fidelity)
    assert m.verdict == ("lossy" if not fidelity.faithful else
                         "approximate" if fidelity.hurried else "ok")
    assert m.ok == fidelity.faithful


ints = st.integers(-50, 50)
operands = st.one_of(ints.map(str), st.just("count"))


@st.composite
def expressions(draw: st.DrawFn, depth: int = 3) -> str:
    if depth == 0 or draw(st.booleans()):
        return draw(operands)
    op = draw(st.sampled_from(["+", "-", "*"]))
    return f"({draw(expressions(depth - 1))} {op} {draw(expressions(depth - 1))})"


@settings(max_examples=100, deadline=None)
@given(text=expressions(), count=st.integers(0, 30))
def test_ruby_integer_arithmetic_matches_python_for_plus_minus_times(text: str,
                                                                     count: int) -> None:
    assert parse_formula(text).value(count) == float(eval(text, {"count": count}))


@pytest.mark.parametrize(("text", "values"), [
    ("7 / 2", [3.0]), ("-7 / 2", [-4.0]), ("7.0 / 2", [3.5]), ("-2 ** 2", [-4.0]),
    ("(count + 1).minutes", [60.0, 120.0]), ("5.minutes * count", [0.0, 300.0]),
    ("2 ** count * 10", [10.0, 20.0]), ("1 / 0", [None]),
])
def test_ruby_rules(text: str, values: list[float | None]) -> None:
    formula = parse_formula(text)
    assert [formula.value(c) for c in range(len(values))] == values


def test_rand_counts_at_its_mean_and_spans_its_band() -> None:
    formula = parse_formula("count ** 4 + 15 + rand(10) * (count + 1)")
    assert formula.random and formula.band(2) == (31.0, 44.5, 58.0)


@pytest.mark.parametrize("text", ["exception.wait", "count +", "x * 2", "(" * 60 + "1",
                                  "'30'", "count.to_s"])
def test_what_is_not_arithmetic_is_refused(text: str) -> None:
    with pytest.raises(FormulaError):
        parse_formula(text)


@pytest.mark.parametrize(("block", "answers"), [
    (" do |count, exception|\n next :kill if exception.is_a?(Stripe::CardError)\n"
     " 30 * (count + 1)\nend", {"Stripe::CardError": ":kill", "*": "30 * (count + 1)"}),
    (" do |c, e|\n if e.is_a?(A) || B === e\n :kill\n elsif e.kind_of?(C) then :discard\n"
     " else\n c ** 2\n end\nend", {"A": ":kill", "B": ":kill", "C": ":discard",
                                   "*": "count ** 2"}),
    (" do |count, e|\n case e\n when A, B\n 10 * (count + 1)\n when C then nil\n end\nend",
     {"A": "10 * (count + 1)", "B": "10 * (count + 1)", "C": None, "*": None}),
    (" do |count, e|\n :kill if e.is_a?(Foo)\nend", {"Foo": ":kill", "*": None}),
])
def test_literal_blocks_are_read(block: str, answers: dict[str, str | None]) -> None:
    assert read_block(block) == answers


@pytest.mark.parametrize("block", [
    " do |count, e|\n case e\n when A then :kill\n end\n 30\nend",  # the case's value is unused
    " do |count, e|\n e.retry_after || 60\nend",
    " do |count, e|\n case e.class\n when A then :kill\n end\nend",
    " do |count, e|\n Rails.logger.warn(e)\n 30\nend",
])
def test_blocks_that_are_code_are_not_guessed(block: str) -> None:
    assert read_block(block) is None


def test_a_near_miss_is_not_printed_as_ratio_1() -> None:
    """A fit off by 0.04% printed "worst per-retry ratio 1" beside a verdict that is not
    exact."""
    from ojs_adapters.migrate._fit import Fit

    said = Fit("exponential", 1.0, 2.0, 0.9996, 3, 1.0).error()
    assert "ratio 0.9996 at retry 3" in said
