"""A tolerant reader of literal ``sidekiq_options`` in Ruby source.

It also reads ``Sidekiq.default_job_options = {...}`` (and the older
``default_worker_options``) and ``config[:max_retries] = N`` in a ``configure_server``
block, reported under those names; and for each class or module (named with the modules
around it, found by indentation: an ``end`` closes what opened at its column) its
superclass, the modules it includes and where it sets ``sidekiq_retries_exhausted`` or
ActiveJob's ``retry_on``, for ``_ruby_classes.resolve`` to give each job class the
options Sidekiq would. Heredocs are text, a tab is 8 columns, ``X = Class.new(Y) do``
opens a class.

It understands only literals (``_ruby_literals``); a ``sidekiq_retry_in`` block is read
when its answers are literal (``_ruby_block``). Anything else (a constant, a method call,
``ENV[...]``, any other block) is recorded as *dynamic* with its line, never guessed.

>>> [job] = read_ruby("class HardJob\\n  sidekiq_options retry: 5, dead: false\\nend\\n")
>>> (job.name, job.options, job.dynamic)
('HardJob', {'retry': 5, 'dead': False}, ())
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

from ojs_adapters.migrate._ruby_block import read_block
from ojs_adapters.migrate._ruby_literals import (
    Dynamic,
    continued,
    parse_pairs,
    ruby_literal,
    strip_comment,
)

_CLASS = re.compile(r"^(\s*)class\s+(?:::)?([A-Z][\w:]*)(?:\s*<\s*(?:::)?([A-Z][\w:]*))?")
_MODULE = re.compile(r"^(\s*)module\s+(?:::)?([A-Z][\w:]*)")
#: ``Inner = Class.new(ApplicationJob) do``: a class by another spelling.
_CLASS_NEW = re.compile(r"^(\s*)([A-Z]\w*)\s*=\s*Class\.new\b(?:\(\s*(?:::)?([A-Z][\w:]*)\s*\))?"
                        r".*\b(?:do|\{)")
#: A heredoc's start: ``<<~ID``/``<<-ID`` (quoted or not) anywhere, a bare ``<<ID`` only
#: where a value starts (after ``=``, ``(``, ``,`` or at the start); ``ID`` in capitals.
_HEREDOC = re.compile(r"(?:<<[~-]|(?:^|[=(,]\s*)<<)(['\"`]?)([A-Z_][A-Z0-9_]*)\1")
_STRING = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")
#: ActiveJob's own retries, which run before Sidekiq sees a failure.
_ACTIVE_JOB_RETRY = re.compile(r"^\s*(retry_on|discard_on)\b")
_END = re.compile(r"^(\s*)end\b")
_ONE_LINE = re.compile(r"(;|\s)end\s*$")
_INCLUDE = re.compile(r"^\s*include\s+(?:::)?([A-Z][\w:]*)")
_JOB_MODULES = {"Sidekiq::Job", "Sidekiq::Worker"}
_EXHAUSTED = re.compile(r"^\s*sidekiq_retries_exhausted\b")
_CONFIGURE = re.compile(r"^(\s*)(?:::)?Sidekiq\.configure_server\s*(?:do|\{)\s*\|\s*(\w+)\s*\|")
_MAX_RETRIES = re.compile(r"^\s*([\w.]+)\[\s*:max_retries\s*\]\s*=\s*([^=].*)$")
_SIDEKIQ_WIDE = {"Sidekiq", "Sidekiq.options", "Sidekiq.default_configuration"}
#: The names ``read_ruby`` reports Sidekiq-wide settings under.
DEFAULTS = ("Sidekiq.default_job_options", "Sidekiq.default_worker_options",
            "Sidekiq[:max_retries]")
_OPTIONS = re.compile(r"^\s*(?:self\.)?sidekiq_options\b(.*)$")
_DEFAULTS = re.compile(r"^\s*Sidekiq\.(default_(?:job|worker)_options)\s*=\s*(.*)$")
_RETRY_IN = re.compile(r"^\s*sidekiq_retry_in\b(.*)$")
_RESULT_SYMBOL = re.compile(r":(kill|discard)\b")


@dataclass(frozen=True)
class RubyJob:
    """The literal Sidekiq options of one class, and what could not be read.

    ``dynamic`` holds ``(line, text)`` pairs for every expression left alone. For a
    class or module: ``kind``; ``parent``, the superclass as written, and ``scope``, the
    modules around it (where Ruby looks names up); ``mixins``, the modules it includes;
    ``exhausted``, the line of a ``sidekiq_retries_exhausted``; ``declared``, whether it
    is a job by itself (``include Sidekiq::Job``, ``sidekiq_options``); ``active_job``,
    where it calls ActiveJob's ``retry_on``/``discard_on``; ``unsure``, that its file's
    ``class``/``end`` nesting could not be followed to the end.
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
    active_job: tuple[int, ...] = ()
    unsure: bool = False


def read_ruby(text: str) -> list[RubyJob]:
    """Every class and module of ``text`` that sets Sidekiq options, includes a module or
    has a superclass (``_ruby_classes.resolve`` decides which are jobs), and the
    Sidekiq-wide settings, in the order of their lines."""
    reader = _Reader()
    lines = text.removeprefix("\ufeff").splitlines()
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
        self.configure: tuple[int, str] | None = None  # a configure_server block's column, var
        self.heredoc: str | None = None  # the terminator of the heredoc being skipped

    def found(self) -> list[RubyJob]:
        kept = [replace(e, unsure=bool(self.scopes)) for e in self.entries.values()
                if e.declared or e.parent or e.mixins or e.exhausted or e.active_job]
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
        line = strip_comment(lines[index])
        indent = len(line) - len(line.lstrip(" \t"))
        line = line[:indent].expandtabs(8) + line[indent:]  # a tab is 8 columns
        number = index + 1
        if self.heredoc is not None:  # text, not code
            if line.strip() == self.heredoc:
                self.heredoc = None
            return index
        heredoc = _HEREDOC.search(_STRING.sub('""', line).strip())
        if heredoc is not None and any(t.strip() == heredoc.group(2) for t in lines[index + 1:]):
            self.heredoc = heredoc.group(2)  # skipped up to its terminator, if it has one
        owner = self.scopes[-1][2] if self.scopes else None
        brace = re.match(r"^(\s*)\}", line)
        if brace and self.configure is not None and self.configure[0] >= len(brace.group(1)):
            self.configure = None  # a configure_server { |config| ... } block ends
        ended = _END.match(line)
        opened = _CLASS.match(line) or _MODULE.match(line) or _CLASS_NEW.match(line)
        if ended:
            column = len(ended.group(1))
            while self.scopes and self.scopes[-1][0] >= column:
                self.scopes.pop()
            if self.configure is not None and self.configure[0] >= column:
                self.configure = None
        elif opened:
            self.open(opened, line, number)
        elif owner is not None and _ACTIVE_JOB_RETRY.match(line):
            found = self.entry(owner, number)
            self.entries[owner] = replace(found, active_job=(*found.active_job, number))
        elif owner is not None and (include := _INCLUDE.match(line)):
            found = self.entry(owner, number)
            module = include.group(1)
            self.entries[owner] = replace(found, mixins=(*found.mixins, module),
                                          declared=found.declared or module in _JOB_MODULES)
        elif owner is not None and _EXHAUSTED.match(line):
            self.entries[owner] = replace(self.entry(owner, number), exhausted=number)
        if (configured := _CONFIGURE.match(line)) is not None:
            self.configure = (len(configured.group(1)), configured.group(2))
        call = _options_call(line, owner)
        retry_in = _RETRY_IN.match(line)
        most = _MAX_RETRIES.match(line)
        if call is not None:
            body, index = continued(call[1], lines, index)
            options, dynamic = parse_pairs(body, number)
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
        elif most and most.group(1) in (_SIDEKIQ_WIDE | {self.configure[1] if self.configure
                                                           else "Sidekiq"}):
            value = ruby_literal(most.group(2))
            dynamic_at = ((number, f"max_retries = {value}"),) if isinstance(value, Dynamic) \
                else ()
            self.wide.append(RubyJob(DEFAULTS[2], number, {"max_retries": value}, dynamic_at,
                                     kind="defaults"))
        return index

    def open(self, opened: re.Match[str], line: str, number: int) -> None:
        """A ``class`` or ``module`` line: its entry, and its scope unless it ends there."""
        kind = "module" if opened.re is _MODULE else "class"
        outer = self.scopes[-1][2] if self.scopes else None
        name = f"{outer}::{opened.group(2)}" if outer else opened.group(2)
        if not _ONE_LINE.search(line) and not line.rstrip().endswith("}"):
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
        text = strip_comment(lines[index])
        body += "\n" + text
        stripped = text.strip()
        if re.match(r"^(if|unless|case|begin|while|until)\b", stripped) or \
                re.search(r"\bdo\s*(\|[^|]*\|)?\s*$", stripped):
            depth += 1
        if stripped == "end" or stripped.startswith("end ") or stripped == "}":
            depth -= 1
    return body, index
