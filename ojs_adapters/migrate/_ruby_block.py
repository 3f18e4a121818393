"""Reading a ``sidekiq_retry_in`` block whose answers are literal.

A block reads when every value it can return is ``:kill``, ``:discard``,
``nil`` or arithmetic in its count parameter (``_arith``), chosen by
``case exception when A, B`` / ``if exception.is_a?(A)`` branches or
``next :kill if exception.is_a?(A)`` guards. The result is the answer
mapping ``from_sidekiq`` takes: error class names to answers, ``'*'`` for
every other error. Anything else gives ``None``: the caller reports the
block, unevaluated.

>>> read_block(" do |count, exception|\\n case exception\\n when Stripe::CardError then :kill\\n"
...            " else 30 * (count + 1)\\n end\\nend")
{'Stripe::CardError': ':kill', '*': '30 * (count + 1)'}
>>> read_block(" { |count| count * 2 }")
{'*': 'count * 2'}
>>> read_block(" do |count, e| e.retry_after end") is None
True
"""

from __future__ import annotations

import re

from ojs_adapters.migrate._arith import FormulaError, parse_formula

#: One answer of the block: a symbol, ``None`` for nil, or an expression in ``count``.
Answer = str | None
_HEAD = re.compile(r"^\s*(?:do\b|\{)\s*(?:\|([^|]*)\|)?(.*)$", re.S)
_CLASS = r"(?:::)?[A-Z]\w*(?:::[A-Z]\w*)*"
_GUARD = re.compile(r"^(?:next|return)\s+(.+?)\s+if\s+(.+)$")
_TRAILING_IF = re.compile(r"^(.+?)\s+if\s+(.+)$")
_WHEN = re.compile(r"^when\s+(.+?)(?:\s+then\s+(.+))?$")
_ELSE = re.compile(r"^else(?:\s+(.+))?$")
_IF = re.compile(r"^(if|elsif)\s+(.+?)(?:\s+then\s+(.+))?$")


class _Unreadable(Exception):
    """The block holds something other than literal answers."""


def read_block(text: str) -> dict[str, Answer] | None:
    """The answers of the block whose text (after ``sidekiq_retry_in``) is ``text``."""
    head = _HEAD.match(text)
    if head is None:
        return None
    params = [p.strip().lstrip("*&") for p in (head.group(1) or "").split(",") if p.strip()]
    count = params[0] if params else "_count"
    error = params[1] if len(params) > 1 else None
    body = re.sub(r"(?:\bend|\})\s*$", "", head.group(2).strip()).strip()
    lines = [line.strip() for line in re.split(r"[\n;]", body) if line.strip()]
    try:
        branches = _statements(lines, count, error)
    except _Unreadable:
        return None
    out: dict[str, Answer] = {}
    for classes, answer in branches:
        for name in classes or ("*",):
            out.setdefault(name.lstrip(":"), answer)
        if classes is None:
            break  # an unconditional answer ends the block
    out.setdefault("*", None)
    return out


def _statements(lines: list[str], count: str, error: str | None
                ) -> list[tuple[tuple[str, ...] | None, Answer]]:
    """``(classes or None, answer)`` in the order Ruby tries them."""
    out: list[tuple[tuple[str, ...] | None, Answer]] = []
    at = 0
    while at < len(lines):
        line = lines[at]
        guard = _GUARD.match(line)
        if guard:
            out.append((_condition(guard.group(2), error), _value(guard.group(1), count)))
        elif error is not None and re.fullmatch(rf"case\s+{re.escape(error)}", line):
            at = _last(_case(lines, at + 1, count, out), lines)
        elif line.startswith("if "):
            at = _last(_if(lines, at, count, error, out), lines)
        elif at == len(lines) - 1:
            trailing = _TRAILING_IF.match(line)
            if trailing and not line.startswith(("next ", "return ")):
                out.append((_condition(trailing.group(2), error), _value(trailing.group(1), count)))
            else:
                out.append((None, _value(line, count)))
        else:
            raise _Unreadable(line)
        at += 1
    return out


def _last(end: int, lines: list[str]) -> int:
    """A ``case`` or ``if`` gives the block's value only as its last statement."""
    if end != len(lines) - 1:
        raise _Unreadable("code after a case or if")
    return end


def _case(lines: list[str], at: int, count: str,
          out: list[tuple[tuple[str, ...] | None, Answer]]) -> int:
    """Read ``when``/``else`` branches up to ``end``; the index of that ``end``."""
    while at < len(lines) and lines[at] != "end":
        when, other = _WHEN.match(lines[at]), _ELSE.match(lines[at])
        if when is None and other is None:
            raise _Unreadable(lines[at])
        inline = when.group(2) if when else other.group(1) if other else None
        if inline is None:
            at += 1
            if at >= len(lines) or lines[at] == "end" or _WHEN.match(lines[at]) \
                    or _ELSE.match(lines[at]):
                raise _Unreadable("a branch with more than one value, or none")
            inline = lines[at]
        classes = _classes(when.group(1)) if when else None
        out.append((classes, _value(inline, count)))
        at += 1
    if at >= len(lines):
        raise _Unreadable("case without end")
    return at


def _if(lines: list[str], at: int, count: str, error: str | None,
        out: list[tuple[tuple[str, ...] | None, Answer]]) -> int:
    """Read ``if``/``elsif``/``else`` branches up to ``end``; the index of that ``end``."""
    while at < len(lines) and lines[at] != "end":
        branch, other = _IF.match(lines[at]), _ELSE.match(lines[at])
        if branch is None and other is None:
            raise _Unreadable(lines[at])
        inline = branch.group(3) if branch else other.group(1) if other else None
        if inline is None:
            at += 1
            if at >= len(lines):
                raise _Unreadable("if without end")
            inline = lines[at]
        classes = _condition(branch.group(2), error) if branch else None
        out.append((classes, _value(inline, count)))
        at += 1
    if at >= len(lines):
        raise _Unreadable("if without end")
    return at


def _condition(text: str, error: str | None) -> tuple[str, ...]:
    """Class names in ``e.is_a?(A) || B === e`` (also ``kind_of?``, ``instance_of?``)."""
    if error is None:
        raise _Unreadable(text)
    name = re.escape(error)
    tests = [rf"{name}\.(?:is_a|kind_of|instance_of)\?\s*\(?\s*({_CLASS})\s*\)?",
             rf"({_CLASS})\s*===\s*{name}"]
    out: list[str] = []
    for part in re.split(r"\s*(?:\|\||\bor\b)\s*", text.strip()):
        match = next((m for t in tests if (m := re.fullmatch(t, part))), None)
        if match is None:
            raise _Unreadable(text)
        out.append(match.group(1))
    return tuple(out)


def _classes(text: str) -> tuple[str, ...]:
    names = [n.strip() for n in text.split(",")]
    if not all(re.fullmatch(_CLASS, n) for n in names):
        raise _Unreadable(text)
    return tuple(names)


def _value(text: str, count: str) -> Answer:
    """A symbol, ``None`` for nil, or the expression with the count parameter as ``count``."""
    text = re.sub(r"^(?:next|return)\s+", "", text.strip())
    if text in (":kill", ":discard"):
        return text
    if text == "nil":
        return None
    try:
        parse_formula(text, count)
    except FormulaError:
        raise _Unreadable(text) from None
    return re.sub(rf"\b{re.escape(count)}\b", "count", text) if count != "count" else text
