"""Reading retry settings from files: JSON, YAML, and Sidekiq's Ruby source.

A document holds either one job's options (``{"retry": 5}``), a mapping of
job names to options (``{"HardJob": {"retry": 5}}``) or a list of options
(each may carry a ``name`` or ``class``). ``DIALECTS`` (``_dialects``) is the table of
translators and the option names that tell the first shape from the second.

>>> [m.policy.max_attempts for m in migrate_text("sidekiq", "HardJob: {retry: 2}\\n")]
[3]
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from ojs_adapters.errors import OjsValidationError
from ojs_adapters.migrate._common import normalize
from ojs_adapters.migrate._dialects import DIALECTS, Dialect
from ojs_adapters.migrate._model import Migration, Note
from ojs_adapters.migrate._ruby import DEFAULTS, RubyJob, read_ruby
from ojs_adapters.migrate._ruby_classes import Resolved, resolve
from ojs_adapters.migrate._ruby_literals import Dynamic

__all__ = ["DIALECTS", "Dialect", "Scan", "load_document", "migrate_path", "migrate_text",
           "scan_path"]

#: Payload fields that name the job (Sidekiq ``class``, Faktory ``jobtype``, ...).
_NAME_KEYS = ("class", "jobtype", "name", "task", "actor_name")


class Scan(NamedTuple):
    """The migrations ``scan_path`` found, and each file a directory scan passed over: why."""

    migrations: list[Migration]
    skipped: list[tuple[str, str]]


def load_document(text: str, origin: str = "<input>") -> Any:
    """Parse JSON or YAML text; ``OjsValidationError`` (``INVALID_PAYLOAD``) if neither."""
    stripped = text.strip()
    if not stripped:
        raise _unreadable(origin, "is empty")
    if stripped[0] in "{[":
        try:
            return json.loads(stripped)
        except ValueError:
            pass  # YAML flow style ({retry: 5}) is not JSON
    try:
        return yaml.safe_load(stripped)
    except yaml.YAMLError as exc:
        raise _unreadable(origin, f"is neither JSON nor YAML ({' '.join(str(exc).split())})")\
            from None


def migrate_text(dialect: str, text: str, *, origin: str = "<input>", ruby: bool = False,
                 retry_options_only: bool = False, **options: Any) -> list[Migration]:
    """Translate every job found in ``text`` (Ruby source when ``ruby``);
    ``retry_options_only`` leaves out a document with no job in it (a directory scan
    meets ``database.yml`` and locale files)."""
    spec = _dialect(dialect)
    if ruby:
        return _from_ruby(spec, [(origin, job) for job in read_ruby(text)], options)
    return _from_document(spec, load_document(text, origin), origin, retry_options_only,
                          options)[0]


def _from_document(spec: Dialect, doc: Any, origin: str, scanned: bool,
                   options: Mapping[str, Any]) -> tuple[list[Migration], str | None]:
    """The jobs of ``doc``; found by a directory scan, none and why if it holds no job of
    the dialect (``database.yml``, a JSON file that is not the dialect's)."""
    why = _passed_over(doc, spec, origin) if scanned else None
    if why:
        return [], why
    return [spec.translate(opts, name=job_name, origin=origin, **_kwargs(spec, options))
            for job_name, opts in _entries(doc, spec, origin)], None


def migrate_path(dialect: str, path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
                 **options: Any) -> list[Migration]:
    """Translate every job in a file, or in every matching file under a directory.

    Several paths (``app/`` and ``config/``) are one run: a job's superclass or Sidekiq's
    defaults may be in any of them; a file named twice is read once.
    """
    return scan_path(dialect, path, **options).migrations


def scan_path(dialect: str, path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
              **options: Any) -> Scan:
    """``migrate_path``, with the files a directory scan passed over and why."""
    spec = _dialect(dialect)
    paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    scanned = _files_of(spec, paths)
    texts = {file: file.read_text(encoding="utf-8-sig", errors="replace") for file in scanned}
    # Ruby files are read together: a job's superclass and Sidekiq's defaults may live in
    # another file of the run, or in Sidekiq's own config file (``:max_retries:``).
    read = {f: _sidekiq_config(spec, f, t) for f, t in texts.items() if f.suffix != ".rb"}
    configs = {f: wide for f, (is_config, wide) in read.items() if is_config}
    # Sidekiq reads its config file before the app's initializers: theirs win.
    found = [(str(f), job) for f, job in configs.items() if job is not None]
    found += [(str(f), job) for f, t in texts.items() if f.suffix == ".rb"
              for job in read_ruby(t)]
    by_file: dict[str, list[Migration]] = {}
    for migration in _from_ruby(spec, found, options):
        by_file.setdefault((migration.origin or "").rpartition(":")[0], []).append(migration)
    out = Scan([], [])
    for file, text in texts.items():
        if file.suffix == ".rb" or file in configs:
            out.migrations.extend(by_file.get(str(file), []))
            continue
        jobs, why = _from_document(spec, load_document(text, str(file)), str(file),
                                   scanned[file], options)
        out.migrations.extend(jobs)
        if why:
            out.skipped.append((str(file), why))
    return out


def _files_of(spec: Dialect, paths: list[str | os.PathLike[str]]) -> dict[Path, bool]:
    """The files to read, in order, each with whether a directory scan found it."""
    if not paths:
        raise OjsValidationError("path: no file or directory given", code="INVALID_PAYLOAD",
                                 details={"field": "path", "rule": "at least one"})
    files: dict[Path, bool] = {}
    seen: set[Path] = set()
    for path in paths:
        root = Path(path)
        if not root.exists():
            raise _unreadable(str(root), "does not exist")
        found = [(root, False)] if root.is_file() else [
            (p, True) for p in sorted(root.rglob("*")) if p.is_file() and p.suffix in spec.suffixes]
        for file, by_scan in found:
            real = file.resolve()
            if real not in seen:
                seen.add(real)
                files[file] = by_scan
    return files


def _sidekiq_config(spec: Dialect, file: Path, text: str) -> tuple[bool, RubyJob | None]:
    """Whether ``file`` is Sidekiq's own config file (``config/sidekiq.yml``), and the
    Sidekiq-wide retry count it sets, if any. As Sidekiq does, an environment's section
    (``production:``) overrides the top level; ERB is left unevaluated."""
    if spec is not DIALECTS["sidekiq"]:
        return False, None
    try:
        doc = load_document(text, str(file))
    except OjsValidationError:
        return False, None
    if not isinstance(doc, Mapping):
        return False, None
    keys = normalize(doc, "sidekiq")
    if not (keys.keys() & _SIDEKIQ_CONFIG or file.name in ("sidekiq.yml", "sidekiq.yaml")):
        return False, None
    value, where = keys.get("max_retries"), "max_retries"
    section = keys.get("production")
    if isinstance(section, Mapping):
        inner = normalize(section, "sidekiq")
        if "max_retries" in inner:
            value, where = inner["max_retries"], "production:"
    if value is None:
        return True, None
    if isinstance(value, str) and "<%" in value:
        value = Dynamic(value)  # ERB: Sidekiq evaluates it, the reader does not
    lines = text.splitlines()
    start = next((n for n, t in enumerate(lines) if where in t), 0)
    line = next((n for n, t in enumerate(lines[start:], start + 1) if "max_retries" in t),
                start + 1)  # the key's own line, inside ``production:`` if it is there
    return True, RubyJob(DEFAULTS[2], line, {"max_retries": value}, kind="defaults")
#: Keys of Sidekiq's own config file besides ``max_retries``.
_SIDEKIQ_CONFIG = {"concurrency", "queues", "timeout", "verbose", "pidfile", "logfile",
                   "require", "environment", "tag", "labels", "strict", "capsules"}


def _dialect(name: str) -> Dialect:
    try:
        return DIALECTS[name]
    except KeyError:
        raise OjsValidationError(
            f"unknown dialect {name!r}; known: {', '.join(DIALECTS)}", code="INVALID_ARGS",
            details={"field": "dialect", "value": name,
                     "rule": "must be one of " + ", ".join(DIALECTS)}) from None


def _kwargs(spec: Dialect, options: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if spec.takes_version and options.get("version") is not None:
        out["version"] = options["version"]
    if spec.takes_cap and options.get("unbounded_attempts") is not None:
        out["unbounded_attempts"] = options["unbounded_attempts"]
    return out


def _passed_over(doc: Any, spec: Dialect, origin: str) -> str | None:
    """Why a scan passes ``doc`` over, whole: no job in it (no mapping naming a job or holding
    one of the dialect's options), or a job whose options are not the dialect's."""
    if not any(_job_like(item, spec) for item in _items(doc)):
        return "no job in it"
    unlike = spec.unlike
    if unlike is None:
        return None
    for job_name, opts in _entries(doc, spec, origin):
        why = unlike(opts) if isinstance(opts, Mapping) else "not a mapping of options"
        if why:
            return f"{job_name}: {why}" if job_name else why
    return None


def _entries(doc: Any, spec: Dialect, origin: str) -> Iterator[tuple[str | None, Any]]:
    """The jobs of a document: ``(name, options)``."""
    if isinstance(doc, list):
        for index, item in enumerate(doc):
            if not isinstance(item, Mapping):
                raise _unreadable(f"{origin}[{index}]", "must be a mapping of options")
            label, rest = _named(item, spec)
            yield label or f"#{index}", rest
        return
    if not isinstance(doc, Mapping):
        raise _unreadable(origin, "must hold a mapping of options, of job names to options, "
                          "or a list")
    keys = {str(k).lstrip(":") for k in doc}
    if not doc or keys & spec.options or not all(isinstance(v, Mapping) for v in doc.values()):
        yield _named(doc, spec)
        return
    for job_name, opts in doc.items():
        yield str(job_name), opts


def _items(doc: Any) -> list[Any]:
    """What may be a job in ``doc``: itself, its items, or its values."""
    if isinstance(doc, list):
        return doc
    if isinstance(doc, Mapping):
        return [doc, *doc.values()]
    return []


def _job_like(item: Any, spec: Dialect) -> bool:
    """A mapping that names a job (``class``, ``jobtype``...) or holds a dialect option."""
    return isinstance(item, Mapping) and any(
        str(k).lstrip(":") in spec.options or k in _NAME_KEYS for k in item)


def _named(item: Mapping[Any, Any], spec: Dialect) -> tuple[str | None, dict[Any, Any]]:
    """The job's name from its payload (``class``, ``jobtype``, ...) and the other options."""
    label = next((item[k] for k in _NAME_KEYS if isinstance(item.get(k), str)), None)
    rest = {k: v for k, v in item.items() if k not in _NAME_KEYS or k in spec.options}
    return label, rest


def _from_ruby(spec: Dialect, found: list[tuple[str, RubyJob]],
               options: Mapping[str, Any]) -> list[Migration]:
    """The migrations of every job class among what ``read_ruby`` found (file, entry)."""
    return [_from_row(spec, row, options) for row in resolve(found)]


def _from_row(spec: Dialect, row: Resolved, options: Mapping[str, Any]) -> Migration:
    job = row.job
    migration = spec.translate(job.options, name=job.name, origin=f"{row.origin}:{job.line}",
                               **_kwargs(spec, options))
    notes = row.notes
    if job.kind == "defaults" or job.name is None:  # no class: its own dynamic lines
        notes += tuple(Note("info", None, f"line {at}: dynamic Ruby left unevaluated: {text}")
                       for at, text in job.dynamic)
    return Migration(migration.dialect, migration.policy, migration.notes + notes,
                     migration.fidelity, migration.handler_codes, migration.name,
                     migration.origin, migration.options, app_wide=job.kind == "defaults")


def _unreadable(origin: str, rule: str) -> OjsValidationError:
    return OjsValidationError(f"{origin} {rule}", code="INVALID_PAYLOAD",
                              details={"field": origin, "rule": rule})
