"""A tolerant reader of literal ``sidekiq_options`` in Ruby source.

It also reads ``Sidekiq.default_job_options = {...}`` (and the older
``default_worker_options``) and ``config[:max_retries] = N`` in a ``configure_server``
block, reported under those names; and for each class or module (named with the modules
around it, found by indentation: an ``end`` closes what opened at its column) its
superclass, the modules it includes and where it sets ``sidekiq_retries_exhausted``, for
``_ruby_classes.resolve`` to give each job class the options Sidekiq would.

It understands only literals: integers, floats, ``true``/``false``/``nil``,
symbols, quoted strings and ``N.unit`` durations (``3.days``). A
``sidekiq_retry_in`` block is read when its answers are literal
(``_ruby_block``). Anything else (a constant, a method call, ``ENV[...]``,
any other block) is recorded as *dynamic* with its line, never guessed.

>>> [job] = read_ruby("class HardJob\\n  sidekiq_options retry: 5, dead: false\\nend\\n")
>>> (job.name, job.options, job.dynamic)
('HardJob', {'retry': 5, 'dead': False}, ())
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

from ojs_adapters.migrate._arith import DURATION_UNITS
from ojs_adapters.migrate._ruby_block import read_block

_CLASS = re.compile(r"^(\s*)class\s+(?:::)?([A-Z][\w:]*)(?:\s*<\s*(?:::)?([A-Z][\w:]*))?")
_MODULE = re.compile(r"^(\s*)module\s+(?:::)?([A-Z][\w:]*)")
_END = re.compile(r"^(\s*)end\b")
_ONE_LINE = re.compile(r"(;|\s)end\s*$")
_INCLUDE = re.compile(r"^\s*include\s+(?:::)?([A-Z][\w:]*)")
_JOB_MODULES = {"Sidekiq::Job", "Sidekiq::Worker"}
_EXHAUSTED = re.compile(r"^\s*sidekiq_retries_exhausted\b")
_CONFIGURE = re.compile(r"Sidekiq\.configure_(?:server|client)\s*(?:do|\{)\s*\|\s*(\w+)\s*\|")
_MAX_RETRIES = re.compile(r"^\s*([\w.]+)\[\s*:max_retries\s*\]\s*=\s*([^=].*)$")
_SIDEKIQ_WIDE = {"Sidekiq", "Sidekiq.options", "Sidekiq.default_configuration"}
#: The names ``read_ruby`` reports Sidekiq-wide settings under.
DEFAULTS = ("Sidekiq.default_job_options", "Sidekiq.default_worker_options",
            "Sidekiq[:max_retries]")
_OPTIONS = re.compile(r"^\s*sidekiq_options\b(.*)$")
_DEFAULTS = re.compile(r"^\s*Sidekiq\.(default_(?:job|worker)_options)\s*=\s*(.*)$")
_RETRY_IN = re.compile(r"^\s*sidekiq_retry_in\b(.*)$")
_NUMBER = re.compile(r"^[-+]?\d[\d_]*(\.\d+)?$")
_DURATION = re.compile(r"^(\d[\d_]*(?:\.\d+)?)\.(" + "|".join(DURATION_UNITS) + r")$")
_SYMBOL_KEY = re.compile(r"^([A-Za-z_]\w*):\s*(.*)$", re.S)
_ROCKET_KEY = re.compile(r"^(:[A-Za-z_]\w*|'[^']*'|\"[^\"]*\")\s*=>\s*(.*)$", re.S)
_RESULT_SYMBOL = re.compile(r":(kill|discard)\b")


class Dynamic(str):
    """A value the reader would not evaluate; the text is the Ruby expression."""

    __slots__ = ()


@dataclass(frozen=True)
class RubyJob:
    """The literal Sidekiq options of one class, and what could not be read.

    ``dynamic`` holds ``(line, text)`` pairs for every expression left alone. For a
    class or module: ``kind``; ``parent``, the superclass as written, and ``scope``, the
    modules around it (where Ruby looks names up); ``mixins``, the modules it includes;
    ``exhausted``, the line of a ``sidekiq_retries_exhausted``; ``declared``, whether it
    is a job by itself (``include Sidekiq::Job``, ``sidekiq_options``).
    """

    name: str | None
    line: int
    options: dict[str, Any] = field(hash=False)
    dynamic: tuple[tuple[int, str], ...] = ()
    parent: str | None = None
    exhausted: int | None = None
    declared: bool = True
    kind: str = "class"
    scope: tuple[str, ...] = ()
    mixins: tuple[str, ...] = ()


def read_ruby(text: str) -> list[RubyJob]:
    """Every class and module of ``text`` that sets Sidekiq options, includes a module or
    has a superclass (``_ruby_classes.resolve`` decides which are jobs), and the
    Sidekiq-wide settings, in the order of their lines."""
    reader = _Reader()
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        index = reader.line(lines, index) + 1
    return reader.found()


class _Reader:
    """``read_ruby``'s state: the classes and modules open at the current line."""

    def __init__(self) -> None:
        self.entries: dict[str | None, RubyJob] = {}  # by owner (class, module or None)
        self.wide: list[RubyJob] = []  # Sidekiq-wide settings
        self.scopes: list[tuple[int, str, str]] = []  # (column, kind, qualified name)
        self.configure: str | None = None

    def found(self) -> list[RubyJob]:
        kept = [e for e in self.entries.values()
                if e.declared or e.parent or e.mixins or e.exhausted]
        return sorted([*kept, *self.wide], key=lambda job: job.line)

    def entry(self, owner: str | None, number: int) -> RubyJob:
        if owner not in self.entries:
            kind = next((k for _, k, n in reversed(self.scopes) if n == owner), "class")
            scope = tuple(n for _, _, n in self.scopes if n != owner)
            self.entries[owner] = RubyJob(owner, number, {}, declared=False, kind=kind,
                                          scope=scope)
        return self.entries[owner]

    def line(self, lines: list[str], index: int) -> int:
        """Read the line at ``index`` (and the lines a call continues on); the last index."""
        line = _strip_comment(lines[index])
        number = index + 1
        owner = self.scopes[-1][2] if self.scopes else None
        ended = _END.match(line)
        opened = _CLASS.match(line) or _MODULE.match(line)
        if ended:
            while self.scopes and self.scopes[-1][0] >= len(ended.group(1)):
                self.scopes.pop()
        elif opened:
            self.open(opened, line, number)
        elif owner is not None and (include := _INCLUDE.match(line)):
            found = self.entry(owner, number)
            module = include.group(1)
            self.entries[owner] = replace(found, mixins=(*found.mixins, module),
                                          declared=found.declared or module in _JOB_MODULES)
        elif owner is not None and _EXHAUSTED.match(line):
            self.entries[owner] = replace(self.entry(owner, number), exhausted=number)
        if (configured := _CONFIGURE.search(line)) is not None:
            self.configure = configured.group(1)
        call = _options_call(line, owner)
        retry_in = _RETRY_IN.match(line)
        most = _MAX_RETRIES.match(line)
        if call is not None:
            body, index = _continued(call[1], lines, index)
            options, dynamic = _parse_pairs(body, number)
            if call[0] in DEFAULTS:
                self.wide.append(RubyJob(call[0], number, options, tuple(dynamic),
                                         kind="defaults"))
            else:
                found = self.entry(call[0], number)
                self.entries[call[0]] = replace(
                    found, options={**found.options, **options}, declared=True,
                    dynamic=found.dynamic + tuple(dynamic),
                    line=found.line if found.options else number)  # where the options are
        elif retry_in:
            block, index = _block(retry_in.group(1), lines, index)
            found = _with_retry_in(self.entry(owner, number), block, number, retry_in.group(1))
            self.entries[owner] = replace(found, declared=True)
        elif most and most.group(1) in (_SIDEKIQ_WIDE | {self.configure or "Sidekiq"}):
            value = ruby_literal(most.group(2))
            dynamic_at = ((number, f"max_retries = {value}"),) if isinstance(value, Dynamic) \
                else ()
            self.wide.append(RubyJob(DEFAULTS[2], number, {"max_retries": value}, dynamic_at,
                                     kind="defaults"))
        return index

    def open(self, opened: re.Match[str], line: str, number: int) -> None:
        """A ``class`` or ``module`` line: its entry, and its scope unless it ends there."""
        kind = "class" if opened.re is _CLASS else "module"
        outer = self.scopes[-1][2] if self.scopes else None
        name = f"{outer}::{opened.group(2)}" if outer else opened.group(2)
        if not _ONE_LINE.search(line):
            self.scopes.append((len(opened.group(1)), kind, name))
        found = self.entry(name, number)
        parent = opened.group(3) if kind == "class" else None
        self.entries[name] = replace(found, parent=found.parent or parent, kind=kind)


def _with_retry_in(job: RubyJob, block: str, line: int, first: str) -> RubyJob:
    """``job`` with its ``sidekiq_retry_in`` answers, or the block as dynamic."""
    answers = read_block(block)
    if answers is not None:
        return replace(job, options={**job.options, "sidekiq_retry_in": answers})
    results = sorted({f":{s}" for s in _RESULT_SYMBOL.findall(block)})
    said = f" returning {', '.join(results)} in some cases" if results else ""
    return replace(job, options={**job.options, "sidekiq_retry_in": Dynamic("block" + said)},
                   dynamic=(*job.dynamic, (line, "sidekiq_retry_in " + first.strip())))


def _options_call(line: str, current_class: str | None) -> tuple[str | None, str] | None:
    """``(owner, arguments)`` when ``line`` starts a ``sidekiq_options`` or defaults call."""
    match = _OPTIONS.match(line)
    if match:
        return current_class, match.group(1)
    match = _DEFAULTS.match(line)
    if match:
        return f"Sidekiq.{match.group(1)}", match.group(2)
    return None


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


def _parse_pairs(body: str, line: int) -> tuple[dict[str, Any], list[tuple[int, str]]]:
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


def _continued(first: str, lines: list[str], index: int) -> tuple[str, int]:
    """Join continuation lines while the call is open (trailing comma, open bracket)."""
    body = first.strip()
    while index + 1 < len(lines) and (body.endswith(",") or _depth(body) > 0):
        index += 1
        body += " " + _strip_comment(lines[index]).strip()
    if body.startswith("(") and body.endswith(")"):
        body = body[1:-1]
    return body, index


def _depth(text: str) -> int:
    return sum(text.count(c) for c in "([{") - sum(text.count(c) for c in ")]}")


def _block(first: str, lines: list[str], index: int) -> tuple[str, int]:
    """The text of a ``{ ... }`` or ``do ... end`` block starting on ``first``."""
    opens_do = re.search(r"\bdo\b", first) is not None
    if "{" in first and first.count("{") <= first.count("}"):
        return first, index  # a one-line { ... } block
    if (not opens_do and "{" not in first) or re.search(r"\bdo\b.*\bend\s*$", first):
        return first, index  # no block, or a one-line do ... end
    body, depth = first, 1
    while index + 1 < len(lines) and depth > 0:
        index += 1
        text = _strip_comment(lines[index])
        body += "\n" + text
        stripped = text.strip()
        if re.match(r"^(if|unless|case|begin|while|until)\b", stripped) or \
                re.search(r"\bdo\s*(\|[^|]*\|)?\s*$", stripped):
            depth += 1
        if stripped == "end" or stripped.startswith("end ") or stripped == "}":
            depth -= 1
    return body, index


def _strip_comment(line: str) -> str:
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#":
            return line[:i]
    return line
