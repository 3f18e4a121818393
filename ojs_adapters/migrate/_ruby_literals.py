"""Ruby literals as Python values: what ``read_ruby`` makes of an option's text.

Integers, floats, ``true``/``false``/``nil``, symbols, quoted strings and ``N.unit``
durations (``3.days``); anything else is ``Dynamic``, its text kept, never guessed.

>>> ruby_literal("3.days"), ruby_literal(":low"), ruby_literal("ENV['X']")
(259200, ':low', "ENV['X']")
"""

from __future__ import annotations

import re
from typing import Any

from ojs_adapters.migrate._arith import DURATION_UNITS

_NUMBER = re.compile(r"^[-+]?\d[\d_]*(\.\d+)?$")
_DURATION = re.compile(r"^(\d[\d_]*(?:\.\d+)?)\.(" + "|".join(DURATION_UNITS) + r")$")
_SYMBOL_KEY = re.compile(r"^([A-Za-z_]\w*):\s*(.*)$", re.S)
_ROCKET_KEY = re.compile(r"^(:[A-Za-z_]\w*|'[^']*'|\"[^\"]*\")\s*=>\s*(.*)$", re.S)


class Dynamic(str):
    """A value the reader would not evaluate; the text is the Ruby expression."""

    __slots__ = ()


def ruby_literal(text: str) -> Any:
    """The Python value of one Ruby literal, or ``Dynamic(text)`` if it is not one."""
    text = text.strip()
    if text in ("true", "false"):
        return text == "true"
    if text == "nil":
        return None
    if _NUMBER.match(text):
        clean = text.replace("_", "")
        return float(clean) if "." in clean else int(clean)
    duration = _DURATION.match(text)
    if duration:
        amount = float(duration.group(1).replace("_", ""))
        seconds = amount * DURATION_UNITS[duration.group(2)]
        return int(seconds) if seconds.is_integer() else seconds
    if re.fullmatch(r":[A-Za-z_]\w*[?!]?", text):
        return text
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"" \
            and text[0] not in text[1:-1] and "#{" not in text:
        return text[1:-1]
    return Dynamic(text)


def parse_pairs(body: str, line: int) -> tuple[dict[str, Any], list[tuple[int, str]]]:
    options: dict[str, Any] = {}
    dynamic: list[tuple[int, str]] = []
    body = body.strip()
    if body.startswith("{") and body.endswith("}"):
        body = body[1:-1]
    for part in _split_top(body):
        pair = _SYMBOL_KEY.match(part) or _ROCKET_KEY.match(part)
        if pair is None:
            dynamic.append((line, part))
            continue
        key = pair.group(1).strip("'\"").lstrip(":")
        value = ruby_literal(pair.group(2))
        options[key] = value
        if isinstance(value, Dynamic):
            dynamic.append((line, f"{key}: {value}"))
    return options, dynamic


def _split_top(body: str) -> list[str]:
    """Split on commas outside brackets and quotes."""
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(body):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(body[start:i])
            start = i + 1
    parts.append(body[start:])
    return [p.strip() for p in parts if p.strip()]


def continued(first: str, lines: list[str], index: int) -> tuple[str, int]:
    """Join continuation lines while the call is open (trailing comma, open bracket)."""
    body = first.strip()
    while index + 1 < len(lines) and (body.endswith(",") or _depth(body) > 0):
        index += 1
        body += " " + strip_comment(lines[index]).strip()
    if body.startswith("(") and body.endswith(")"):
        body = body[1:-1]
    return body, index


def _depth(text: str) -> int:
    return sum(text.count(c) for c in "([{") - sum(text.count(c) for c in ")]}")


def strip_comment(line: str) -> str:
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#":
            return line[:i]
    return line
