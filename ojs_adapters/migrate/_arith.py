"""Ruby arithmetic in one variable, ``count``: what a ``sidekiq_retry_in`` block returns.

``parse_formula`` reads numbers, ``count``, ``+ - * / % **``, parentheses,
``rand(n)``, ActiveSupport units (``5.minutes``, ``(count + 1).hours``) and
``.to_i``/``.to_f``, and evaluates them with Ruby's rules (integer division
floors). Anything else raises ``FormulaError``, so a caller reports the code
instead of guessing. ``rand`` terms count at their expected value.

>>> f = parse_formula("30 * (count + 1)")
>>> [f.value(c) for c in range(3)]
[30.0, 60.0, 90.0]
>>> parse_formula("count ** 4 + 15 + rand(10) * (count + 1)").band(1)  # low, mean, high
(16.0, 25.0, 34.0)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Literal

#: Seconds in each ActiveSupport duration unit Sidekiq users write (``3.days``).
DURATION_UNITS: dict[str, int] = {
    "second": 1, "seconds": 1, "minute": 60, "minutes": 60, "hour": 3_600, "hours": 3_600,
    "day": 86_400, "days": 86_400, "week": 604_800, "weeks": 604_800,
    "month": 2_629_746, "months": 2_629_746, "year": 31_556_952, "years": 31_556_952,
}
#: Longest expression and deepest nesting read; past them the text is reported, not read.
MAX_LENGTH, MAX_DEPTH = 400, 40
#: Largest integer power computed exactly; beyond it the value is infinite.
_MAX_BITS = 4096

Draw = Literal["low", "mean", "high"]
Number = int | float
Node = tuple[Any, ...]
_TOKEN = re.compile(r"\s*(?:(\d[\d_]*(?:\.\d+)?(?:[eE][-+]?\d+)?)|([A-Za-z_]\w*[?!]?)"
                    r"|(\*\*|[-+*/%().]))")
_METHODS = {"to_i", "to_f", "ceil", "floor", "round", *DURATION_UNITS}


class FormulaError(ValueError):
    """The text is not arithmetic this reader evaluates."""


@dataclass(frozen=True)
class Formula:
    """A parsed delay expression in ``count`` (Sidekiq's 0-based retry count)."""

    text: str
    tree: Node
    #: Whether the value depends on ``count``; a constant otherwise.
    uses_count: bool
    #: Whether a ``rand`` term makes the value random.
    random: bool

    def value(self, count: int, draw: Draw = "mean") -> float | None:
        """The value for ``count`` with ``rand`` at its ``draw``; ``None`` if Ruby would raise."""
        try:
            result = float(_eval(self.tree, count, draw))
        except ZeroDivisionError:
            return None
        except OverflowError:
            return math.inf
        return None if math.isnan(result) else result

    def band(self, count: int) -> tuple[float, float, float] | None:
        """``(low, mean, high)`` over the ``rand`` draws; ``None`` if Ruby would raise."""
        values = [self.value(count, d) for d in ("low", "mean", "high")]
        if any(v is None for v in values):
            return None
        low, mean, high = (float(v) for v in values if v is not None)
        return min(low, high), mean, max(low, high)


def parse_formula(text: str, variable: str = "count") -> Formula:
    """Parse ``text``, reading ``variable`` as the retry count; ``FormulaError`` if it cannot."""
    if len(text) > MAX_LENGTH:
        raise FormulaError("too long to read")
    tokens = _tokens(text, variable)
    parser = _Parser(tokens)
    tree = parser.expression(0)
    if parser.at < len(tokens):
        raise FormulaError(f"unexpected {tokens[parser.at]!r}")
    kinds = set(_kinds(tree))
    return Formula(text.strip(), tree, "count" in kinds, "rand" in kinds)


def _kinds(node: Node) -> list[str]:
    """The kinds of every node in the tree (``num``, ``count``, ``rand``, ``op``, ``call``)."""
    out = [node[0]]
    for child in node[1:]:
        if isinstance(child, tuple):
            out.extend(_kinds(child))
    return out


def _tokens(text: str, variable: str) -> list[str]:
    out: list[str] = []
    at, end = 0, len(text.rstrip())
    while at < end:
        match = _TOKEN.match(text, at)
        if match is None or match.end() == at:
            raise FormulaError(f"cannot read {text[at:at + 12]!r}")
        token = match.group(match.lastindex or 0)
        out.append("count" if token == variable else token)
        at = match.end()
    return out


class _Parser:
    """Recursive descent with Ruby's precedence: ``**`` > unary minus > ``* / %`` > ``+ -``."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens, self.at = tokens, 0

    def peek(self) -> str | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token != expected):
            raise FormulaError(f"expected {expected or 'more'}, got {token!r}")
        self.at += 1
        return token

    def expression(self, depth: int) -> Node:
        if depth > MAX_DEPTH:
            raise FormulaError("nested too deeply")
        node = self.term(depth)
        while self.peek() in ("+", "-"):
            node = ("op", self.take(), node, self.term(depth))
        return node

    def term(self, depth: int) -> Node:
        node = self.unary(depth)
        while self.peek() in ("*", "/", "%"):
            node = ("op", self.take(), node, self.unary(depth))
        return node

    def unary(self, depth: int) -> Node:
        if depth > MAX_DEPTH:
            raise FormulaError("nested too deeply")
        if self.peek() in ("-", "+"):
            sign = self.take()
            inner = self.unary(depth + 1)
            return ("op", "-", ("num", 0), inner) if sign == "-" else inner
        node = self.postfix(depth)
        if self.peek() == "**":
            self.take()
            node = ("op", "**", node, self.unary(depth + 1))
        return node

    def postfix(self, depth: int) -> Node:
        node = self.primary(depth)
        while self.peek() == ".":
            self.take()
            method = self.take()
            if method not in _METHODS:
                raise FormulaError(f"unknown method {method!r}")
            node = ("call", method, node)
        return node

    def primary(self, depth: int) -> Node:
        token = self.take()
        if token == "(":
            node = self.expression(depth + 1)
            self.take(")")
            return node
        if token == "count":
            return ("count",)
        if token == "rand":
            limit: Node | None = None
            if self.peek() == "(":
                self.take()
                if self.peek() != ")":
                    limit = self.expression(depth + 1)
                self.take(")")
            return ("rand", limit)
        if token[0].isdigit():
            clean = token.replace("_", "")
            return ("num", float(clean) if any(c in clean for c in ".eE") else int(clean))
        raise FormulaError(f"unexpected {token!r}")


def _eval(node: Node, count: int, draw: Draw) -> Number:
    kind = node[0]
    if kind == "num":
        return node[1]  # type: ignore[no-any-return]
    if kind == "count":
        return count
    if kind == "rand":
        # rand(n) draws an integer in [0, n - 1]; rand(x) a float in [0, x); rand() in [0, 1).
        limit = 0 if node[1] is None else _eval(node[1], count, draw)
        top = float(limit - 1) if isinstance(limit, int) and limit else float(limit or 1.0)
        return {"low": 0.0, "mean": top / 2, "high": top}[draw]
    if kind == "call":
        return _call(node[1], _eval(node[2], count, draw))
    left, right = _eval(node[2], count, draw), _eval(node[3], count, draw)
    return _apply(node[1], left, right)


def _call(method: str, value: Number) -> Number:
    if method in DURATION_UNITS:
        return value * DURATION_UNITS[method]
    if method == "to_f" or math.isnan(value):
        return float(value)
    if math.isinf(value):
        raise OverflowError(method)
    if method == "ceil":
        return math.ceil(value)
    if method == "floor":
        return math.floor(value)
    return round(value) if method == "round" else int(value)


def _apply(op: str, left: Number, right: Number) -> Number:
    both_int = isinstance(left, int) and isinstance(right, int)
    if op == "+":
        return left + right
    if op == "-":
        return left - right
    if op == "*":
        return left * right
    if op == "/":
        return left // right if both_int else left / right
    if op == "%":
        return left % right
    if both_int and right > 0 and abs(left) > 1 and right * math.log2(abs(left)) > _MAX_BITS:
        return math.inf
    result = left ** right
    return result if isinstance(result, (int, float)) else math.nan  # a complex root
