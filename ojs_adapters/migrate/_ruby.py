"""A tolerant reader of literal ``sidekiq_options`` in Ruby source.

It also reads ``Sidekiq.default_job_options = {...}`` (and the older
``default_worker_options``) and ``config[:max_retries] = N``, reported under those
names, each class's superclass and ``include Sidekiq::Job``, and where a class sets
``sidekiq_retries_exhausted``; ``resolve`` then gives each job class the options Sidekiq
would (the defaults, then its ancestors', then its own).

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

_CLASS = re.compile(r"^\s*class\s+([A-Z][\w:]*)(?:\s*<\s*([A-Z][\w:]*))?")
_INCLUDE = re.compile(r"^\s*include\s+Sidekiq::(?:Job|Worker)\b")
_EXHAUSTED = re.compile(r"^\s*sidekiq_retries_exhausted\b")
_MAX_RETRIES = re.compile(r"\[\s*:max_retries\s*\]\s*=\s*([^=].*)$")
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

    ``dynamic`` holds ``(line, text)`` pairs for every expression left alone;
    ``parent`` the superclass; ``exhausted`` the line of a ``sidekiq_retries_exhausted``;
    ``declared`` false for a class known only as some class's subclass.
    """

    name: str | None
    line: int
    options: dict[str, Any] = field(hash=False)
    dynamic: tuple[tuple[int, str], ...] = ()
    parent: str | None = None
    exhausted: int | None = None
    declared: bool = True  # a job by itself (options, ``include Sidekiq::Job``)


def read_ruby(text: str) -> list[RubyJob]:
    """Every ``sidekiq_options`` call in ``text``, with the class it belongs to, and every
    class that is a job without one (it includes ``Sidekiq::Job`` or has a superclass,
    which ``resolve`` looks at)."""
    jobs: list[RubyJob] = []
    classes: dict[str, tuple[int, str | None, bool]] = {}  # name: line, parent, includes
    exhausted: dict[str, int] = {}
    current_class: str | None = None
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        line = _strip_comment(lines[index])
        number = index + 1
        match = _CLASS.match(line)
        if match:
            current_class = match.group(1)
            classes[current_class] = (number, match.group(2), False)
        elif current_class and _INCLUDE.match(line):
            classes[current_class] = (*classes[current_class][:2], True)
        elif current_class and _EXHAUSTED.match(line):
            exhausted[current_class] = number
        call = _options_call(line, current_class)
        retry_in = _RETRY_IN.match(line)
        most = _MAX_RETRIES.search(line)
        if call is not None:
            body, index = _continued(call[1], lines, index)
            options, dynamic = _parse_pairs(body, number)
            jobs.append(RubyJob(call[0], number, options, tuple(dynamic)))
        elif retry_in:
            block, index = _block(retry_in.group(1), lines, index)
            where = _job_for(jobs, current_class, number)
            jobs[where] = _with_retry_in(jobs[where], block, number, retry_in.group(1))
        elif most:
            value = ruby_literal(most.group(1))
            dynamic_at = ((number, f"max_retries = {value}"),) if isinstance(value, Dynamic) else ()
            jobs.append(RubyJob(DEFAULTS[2], number, {"max_retries": value}, dynamic_at))
        index += 1
    named = {job.name for job in jobs}
    for name, (number, parent, includes) in classes.items():
        if name not in named and (includes or parent):
            jobs.append(RubyJob(name, number, {}, declared=includes))
    return [replace(job, parent=classes[job.name][1], exhausted=exhausted.get(job.name))
            if job.name in classes else job for job in jobs]


def resolve(found: list[tuple[str, RubyJob]]) -> list[tuple[str, RubyJob, tuple[str, ...]]]:
    """Each job class of a run (``(origin, job)`` pairs, in order) with the options Sidekiq
    gives it: the run's defaults, then its ancestors', then its own (``sidekiq_options``
    merges into the inherited ones); with what it took from where. A class that is no job
    (no ``sidekiq_options``, no ``include Sidekiq::Job``, none in its ancestors) is left out.
    """
    classes: dict[str, tuple[str, RubyJob]] = {}
    for origin, job in found:
        if job.name is not None and job.name not in DEFAULTS:
            classes[job.name] = (origin, _merged(classes[job.name][1], job)
                                 if job.name in classes else job)
    defaults: dict[str, Any] = {}
    taken: list[str] = []
    for origin, job in found:
        if job.name in DEFAULTS:
            defaults.update(job.options)
            taken.append(f"{', '.join(job.options)} from {job.name} ({origin}:{job.line})")
    out: list[tuple[str, RubyJob, tuple[str, ...]]] = []
    done: set[str] = set()
    for origin, job in found:
        if job.name is None or job.name in DEFAULTS:
            out.append((origin, job, ()))
            continue
        if job.name in done:
            continue
        done.add(job.name)
        chain = _ancestors(job.name, classes)
        if not any(entry.declared for _, entry in chain):
            continue
        said = [f"Sidekiq-wide: {t}" for t in taken] if defaults else []
        options, exhausted = dict(defaults), None
        dynamic: list[tuple[int, str]] = []
        for at, entry in chain:
            if entry.name != job.name and entry.options:
                said.append(f"inherited from {entry.name} ({at}:{entry.line}): "
                            f"{', '.join(entry.options)}")
            options.update(entry.options)
            dynamic.extend(entry.dynamic)
            exhausted = entry.exhausted or exhausted
        mine = classes[job.name][1]
        out.append((classes[job.name][0], replace(mine, options=options, dynamic=tuple(dynamic),
                                                  exhausted=exhausted), tuple(said)))
    return out


def _merged(first: RubyJob, later: RubyJob) -> RubyJob:
    """Two entries of one class (reopened, or two calls): the later options win."""
    return replace(first, options={**first.options, **later.options},
                   dynamic=first.dynamic + later.dynamic, parent=first.parent or later.parent,
                   exhausted=first.exhausted or later.exhausted,
                   declared=first.declared or later.declared)


def _ancestors(name: str, classes: dict[str, tuple[str, RubyJob]]) -> list[tuple[str, RubyJob]]:
    """``name``'s ancestors found in the run, and itself; root first."""
    chain: list[tuple[str, RubyJob]] = []
    current: str | None = name
    while current in classes and all(entry.name != current for _, entry in chain):
        chain.append(classes[current])
        current = classes[current][1].parent
    return list(reversed(chain))


def _with_retry_in(job: RubyJob, block: str, line: int, first: str) -> RubyJob:
    """``job`` with its ``sidekiq_retry_in`` answers, or the block as dynamic."""
    answers = read_block(block)
    if answers is not None:
        return RubyJob(job.name, job.line, {**job.options, "sidekiq_retry_in": answers},
                       job.dynamic)
    results = sorted({f":{s}" for s in _RESULT_SYMBOL.findall(block)})
    said = f" returning {', '.join(results)} in some cases" if results else ""
    return RubyJob(job.name, job.line, {**job.options, "sidekiq_retry_in": Dynamic("block" + said)},
                   (*job.dynamic, (line, "sidekiq_retry_in " + first.strip())))


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


def _job_for(jobs: list[RubyJob], name: str | None, line: int) -> int:
    """Index of the latest job of class ``name``, adding an empty one if there is none."""
    for index in range(len(jobs) - 1, -1, -1):
        if jobs[index].name == name:
            return index
    jobs.append(RubyJob(name, line, {}, ()))
    return len(jobs) - 1


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
