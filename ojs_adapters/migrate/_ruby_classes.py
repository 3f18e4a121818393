"""Which classes of a Sidekiq app are jobs, and the options Sidekiq gives each.

A job class gets the app's defaults (``Sidekiq.default_job_options``,
``config[:max_retries]``), then, from its root ancestor down to itself, each class's
included modules' options and its own: ``sidekiq_options`` merges into what is inherited.
Names are looked up as Ruby looks constants up, from the innermost module outwards.
A job is told which app-wide retry settings it takes, and where they are; the app-wide
options that are not retry settings are said once, on their own row. The row of
``Sidekiq.default_job_options``, what a job with no options of its own gets, takes the
app's ``max_retries`` too.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ojs_adapters.migrate._model import Note
from ojs_adapters.migrate._ruby import DEFAULTS, RubyJob
from ojs_adapters.migrate.sidekiq import RETRY_OPTIONS

#: Superclasses of a framework or Ruby itself, never in an app's files.
_OUTSIDE = {"Object", "BasicObject", "StandardError", "Struct"}
_OUTSIDE_PREFIXES = ("ActiveJob::", "ActiveRecord::")


@dataclass(frozen=True)
class Resolved:
    """One row of a run: a job class (or module, or Sidekiq-wide setting) with the options
    Sidekiq gives it, the file it is in, and notes on where they came from."""

    origin: str
    job: RubyJob
    notes: tuple[Note, ...] = ()


def resolve(found: list[tuple[str, RubyJob]]) -> list[Resolved]:
    """The rows of a run from every ``(file, entry)`` ``read_ruby`` found, in order."""
    named: dict[str, tuple[str, RubyJob]] = {}  # a class's entries merged
    pieces: dict[str, list[tuple[str, RubyJob]]] = {}  # and each with its file
    for origin, job in found:
        if job.name is not None and job.kind != "defaults":
            named[job.name] = (named[job.name][0], _merged(named[job.name][1], job)) \
                if job.name in named else (origin, job)
            pieces.setdefault(job.name, []).append((origin, job))
    # Each app-wide retry setting with the entry that sets it last (Sidekiq's order).
    wide: dict[str, tuple[str, RubyJob]] = {}
    for origin, job in found:
        if job.kind == "defaults":
            wide.update({key: (origin, job) for key in job.options if key in RETRY_OPTIONS})
    included = {m for _, job in named.values() for m in _found(job.mixins, job, named)}
    rows: list[Resolved] = []
    done: set[str] = set()
    for origin, job in found:
        if job.kind == "defaults":
            rows.append(_wide_row(origin, job, wide))
        elif job.name is None:
            rows.append(Resolved(origin, job))
        elif job.name not in done:
            done.add(job.name)
            row = _row(job.name, named, pieces, wide, included)
            if row is not None:
                rows.append(row)
    return rows


def _wide_row(origin: str, job: RubyJob, wide: dict[str, tuple[str, RubyJob]]) -> Resolved:
    """An app-wide entry's row; ``Sidekiq.default_job_options``, the options a job with
    none of its own starts from, also takes the app's ``max_retries``, as the jobs do."""
    count = wide.get("max_retries")
    if count is None or job.name == DEFAULTS[2] or "max_retries" in job.options \
            or job.options.get("retry", True) is not True:  # a count: max_retries not read
        return Resolved(origin, job)
    options = {**job.options, "max_retries": count[1].options["max_retries"]}
    return Resolved(origin, replace(job, options=options), _taken({"max_retries": count}))


def _taken(wide: dict[str, tuple[str, RubyJob]]) -> tuple[Note, ...]:
    """A note per app-wide entry naming the settings a row takes from it."""
    by_entry: dict[tuple[str, int, str | None], list[str]] = {}
    for key, (origin, entry) in wide.items():
        by_entry.setdefault((origin, entry.line, entry.name), []).append(key)
    return tuple(Note("info", None, f"Sidekiq-wide: {', '.join(keys)} from {name} "
                      f"({origin}:{line})") for (origin, line, name), keys in by_entry.items())


def _row(name: str, named: dict[str, tuple[str, RubyJob]],
         pieces: dict[str, list[tuple[str, RubyJob]]], wide: dict[str, tuple[str, RubyJob]],
         included: set[str]) -> Resolved | None:
    origin, job = named[name]
    if job.kind == "module":
        if name in included or not (job.options or any(p.exhausted for _, p in pieces[name])):
            return None
        return Resolved(origin, job, (Note("info", None, "a module: its options apply to "
                                           "the classes that include it, none of them in "
                                           "the files read"),))
    chain, missing = _ancestors(name, named)
    parts: list[tuple[str, str, RubyJob]] = []  # (how, origin, entry), root first
    for at, entry in chain:
        parts += [("from module", *named[m]) for m in _found(entry.mixins, entry, named)]
        parts.append(("inherited from" if entry.name != name else "", at, entry))
    if not any(entry.declared for _, _, entry in parts):
        return None
    own = {key: value for _, _, entry in parts for key, value in entry.options.items()}
    taken = {key: at for key, at in wide.items() if key not in own}
    retry = own["retry"] if "retry" in own else \
        taken["retry"][1].options["retry"] if "retry" in taken else True
    if retry is not True:  # a count (its own or app-wide): max_retries is not read
        taken.pop("max_retries", None)
    notes = list(_taken(taken))
    options = {key: entry.options[key] for key, (_, entry) in taken.items()}
    exhausted: tuple[str, int] | None = None
    unsure: list[str] = []
    for how, at, entry in parts:
        if how and entry.options:
            notes.append(Note("info", None, f"{how} {entry.name} ({at}:{entry.line}): "
                              f"{', '.join(entry.options)}"))
        options.update(entry.options)
        for file, piece in pieces[entry.name or ""]:  # what a line says, in its own file
            notes += [Note("info", None, f"line {line} ({file}): dynamic Ruby left "
                           f"unevaluated: {text}") for line, text in piece.dynamic]
            notes += [Note("lossy", "retry_on", f"{file}:{line}: ActiveJob's "
                           "retry_on/discard_on retry or drop the job before Sidekiq sees a "
                           "failure, and the policy holds only Sidekiq's retries: translate "
                           "them by hand") for line in piece.active_job]
            if piece.exhausted is not None:
                exhausted = (file, piece.exhausted)
            if piece.unsure:
                unsure.append(file)
    if missing is not None and missing not in _OUTSIDE \
            and not missing.startswith(_OUTSIDE_PREFIXES):
        notes.append(Note("approximate", None, f"superclass {missing} is not in the files "
                          "read: any Sidekiq options it sets are not included (read the "
                          "directory that holds it too)"))
    notes += [Note("approximate", None, f"{file}: the class/end nesting of this file could "
                   "not be followed to its end (an end missing, or indentation the reader "
                   "cannot follow): check which class each option was given to")
              for file in dict.fromkeys(unsure)]
    if exhausted is not None:
        notes.append(Note("lossy", "sidekiq_retries_exhausted", f"{exhausted[0]}:"
                          f"{exhausted[1]}: a block run when retries are exhausted is not "
                          "part of an OJS policy; hook the adapters' dead-letter event "
                          "(ojs_adapters.runtime.alerts.on_dead_letter)"))
    return Resolved(origin, replace(job, options=options), tuple(notes))


def _ancestors(name: str, named: dict[str, tuple[str, RubyJob]],
               ) -> tuple[list[tuple[str, RubyJob]], str | None]:
    """``name`` and its ancestors found in the run, root first; and the first superclass
    not found (``None`` if the chain ends at a class with none)."""
    chain = [named[name]]
    while chain[-1][1].parent is not None:
        entry = chain[-1][1]
        parent = _lookup(entry.parent or "", entry, named)
        if parent is None or any(e.name == parent for _, e in chain):
            return list(reversed(chain)), None if parent else entry.parent
        chain.append(named[parent])
    return list(reversed(chain)), None


def _found(names: tuple[str, ...], where: RubyJob,
           named: dict[str, tuple[str, RubyJob]]) -> list[str]:
    """The modules among ``names`` that the run defines (as looked up from ``where``)."""
    out = [_lookup(n, where, named) for n in names]
    return [n for n in out if n is not None and named[n][1].kind == "module"]


def _lookup(name: str, where: RubyJob, named: dict[str, tuple[str, RubyJob]]) -> str | None:
    """The full name ``name``, written in ``where``, refers to, if the run defines it."""
    for scope in (*reversed(where.scope), ""):
        full = f"{scope}::{name}" if scope else name
        if full in named:
            return full
    return None


def _merged(first: RubyJob, later: RubyJob) -> RubyJob:
    """A class opened again (here or in another file): the later options win. What its
    lines say (dynamic text, blocks) stays with each entry, which knows its file."""
    return replace(first, options={**first.options, **later.options},
                   parent=first.parent or later.parent,
                   declared=first.declared or later.declared,
                   mixins=first.mixins + later.mixins)

