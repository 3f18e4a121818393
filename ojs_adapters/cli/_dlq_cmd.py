"""``ojs-retry dlq``: list, show, replay, delete, purge and prune dead letters.

Every verb opens the framework's dead letters through ``ojs_adapters.runtime.dlq``
(``--broker URL``, or ``--app module[:attr]`` naming the app or broker object,
imported from the current directory as ``celery -A`` does) and prints a table or,
with ``--json``, one JSON document. Without ``--queue`` it looks in every
dead-letter queue it can find; where the broker cannot list them all (RabbitMQ
without its management API) it says on stderr where it looked. The core imports
no framework: the adapter is found through the ``ojs_adapters.runtime.dlq`` entry points
and loaded only when a verb runs. The shared options are in ``_dlq_options``, what the
verbs say besides their results (notes, skipped ids, failures) in ``_dlq_report``.

>>> from click.testing import CliRunner
>>> CliRunner().invoke(dlq, ["list", "--framework", "none"]).exit_code
1
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timezone

import click
from rich.table import Table

from ojs_adapters.cli._dlq_options import (
    connection_options,
    duration_option,
    filter_options,
    selection,
)
from ojs_adapters.cli._dlq_report import (
    failure,
    letters,
    partial_note,
    reports_errors,
    tell,
    tell_skipped,
)
from ojs_adapters.cli._io import console, print_json
from ojs_adapters.durations import format_duration
from ojs_adapters.errors import OjsError
from ojs_adapters.runtime.dlq import (
    DEFAULT_MAX_AGE,
    DEFAULT_MAX_COUNT,
    DeadLetter,
    DeadLetterQueue,
    OriginalQueueWanted,
    Retention,
    open_dead_letter_queue,
    read_options,
    round_starts,
)


@contextmanager
def _opened(framework: str, app: str | None, broker: str | None, options: tuple[str, ...],
            queue: str | None = None) -> Iterator[DeadLetterQueue]:
    try:
        settings = read_options(framework, options)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--option'") from None
    try:
        dlq = open_dead_letter_queue(framework, app=app, broker=broker,
                                     queues=[queue] if queue else [], options=settings)
    except OriginalQueueWanted as exc:  # it would look for that queue's own dead letters
        raise click.BadParameter(exc.pass_instead(), param_hint="'--queue'") from None
    except (LookupError, ValueError, TypeError, ImportError, AttributeError) as exc:
        raise click.ClickException(str(exc)) from None
    except Exception as exc:  # the broker, reached while opening (Celery on Redis)
        raise failure(exc, broker, app, None) from None
    try:
        yield dlq
    except (OjsError, ValueError, click.ClickException, click.exceptions.Exit,
            click.exceptions.Abort):
        raise
    except Exception as exc:
        raise failure(exc, broker, app, getattr(dlq, "broker_url", None)) from None
    finally:
        dlq.close()


@click.group()
def dlq() -> None:
    """Manage dead-lettered jobs: list, show, replay, delete, purge, prune.

    \b
    Examples:
      ojs-retry dlq list --framework dramatiq --broker redis://localhost:6379/0
      ojs-retry dlq list --framework dramatiq --broker amqp://guest:guest@localhost:5672/%2F
      ojs-retry dlq list --framework celery --app app   (from the app's folder, as celery -A)
      ojs-retry dlq list --framework celery --app myapp.celery:app --error-type 'payment.*'
      ojs-retry dlq show JOB_ID --framework celery --app myapp.celery:app
      ojs-retry dlq replay --framework dramatiq --app myapp.broker:broker --task-type charge
      ojs-retry dlq prune --framework dramatiq --broker redis://localhost --max-age P30D
    """


@dlq.command(name="list")
@connection_options
@filter_options
@click.option("--page", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--per-page", type=click.IntRange(min=1), default=50, show_default=True)
@reports_errors
def list_(framework: str, app: str | None, broker: str | None, options: tuple[str, ...],
          as_json: bool, queue: str | None, task_type: str | None, error_type: str | None,
          since: str | None, until: str | None, page: int, per_page: int) -> None:
    """List dead letters, oldest first, one page at a time."""
    filters = selection(queue, task_type, error_type, since, until)
    with _opened(framework, app, broker, options, queue) as queue_:
        found = queue_.list(filters, page=page, per_page=per_page)
        coverage = None if queue else queue_.coverage()
        note = partial_note(queue_, queue, app)
    if as_json:
        print_json({"page": found.number, "per_page": found.size, "pages": found.pages,
                    "total": found.total,
                    "items": [x.to_dict(payload=False) for x in found.items],
                    "coverage": coverage.to_dict() if coverage else None})
        tell(note)
        return
    table = Table(title=f"page {found.number}/{found.pages}, {letters(found.total)}")
    # The id and the time stay whole; the names fold, and get the width the rest leaves.
    for name in ("id", "queue", "task type", "error", "attempt", "dead-lettered (UTC)"):
        whole = name in ("id", "dead-lettered (UTC)")
        table.add_column(name, no_wrap=whole, overflow="ellipsis" if whole else "fold")
    for x in found.items:
        table.add_row(x.id, x.queue, x.task_type, x.error_type or "-", _attempt(x),
                      f"{x.dead_lettered_at.astimezone(timezone.utc):%Y-%m-%d %H:%M:%S}")
    console().print(table)
    tell(note)


def _attempt(letter: DeadLetter) -> str:
    """The attempt it died at, and how often it was replayed before (if it was)."""
    replays = letter.replay_count
    return str(letter.attempt) if not replays else f"{letter.attempt}, replayed {replays}x"


@dlq.command()
@click.argument("job_id")
@connection_options
@click.option("--queue", help="The job's original queue.")
@reports_errors
def show(job_id: str, framework: str, app: str | None, broker: str | None,
         options: tuple[str, ...], as_json: bool, queue: str | None) -> None:
    """Show one dead job: its full error history and original payload."""
    with _opened(framework, app, broker, options, queue) as queue_:
        found = queue_.show(job_id)
        note = partial_note(queue_, queue, app) if found is None else None
    if found is None:
        tell(note)
        raise click.ClickException(f"no dead letter with id {job_id!r}")
    data = found.to_dict()
    if as_json:
        print_json(data)
        return
    out = console()
    for key in ("id", "queue", "task_type", "error_type", "error_code", "dead_lettered_at",
                "attempt", "replay_count", "last_replayed_at"):
        out.print(f"{key}: {data[key]}", markup=False)  # a job's text, not rich markup
    out.print("history:")
    starts = round_starts(found.history, found.replay_count)
    for entry, start in zip(found.history, starts, strict=True):
        if start is not None:
            out.print(f"  -- replayed from the dead-letter queue: round {start} starts "
                      f"(attempts count from 1 again)")
        out.print(f"  attempt {entry.attempt} {entry.occurred_at} {entry.code} {entry.type}: "
                  f"{entry.message}", markup=False)
    out.print_json(data=data["payload"], default=str)


@dlq.command()
@click.argument("job_ids", nargs=-1)
@connection_options
@filter_options
@click.option("--all", "everything", is_flag=True, help="Replay every dead letter.")
@click.option("--limit", type=click.IntRange(min=1), help="Replay at most this many, oldest first.")
@reports_errors
def replay(job_ids: tuple[str, ...], framework: str, app: str | None, broker: str | None,
           options: tuple[str, ...], as_json: bool, queue: str | None, task_type: str | None,
           error_type: str | None, since: str | None, until: str | None, everything: bool,
           limit: int | None) -> None:
    """Send dead jobs back to their queues as attempt 1 (history kept).

    Safe to interrupt: each job is either still dead or queued once.
    """
    filters = selection(queue, task_type, error_type, since, until, job_ids)
    if filters.is_empty and not everything:
        raise click.UsageError("give job ids, a filter, or --all")
    with _opened(framework, app, broker, options, queue) as queue_:
        report = queue_.replay(filters, limit=limit)
        note = partial_note(queue_, queue, app)
    tell(note)
    if as_json:
        print_json({"replayed": list(report.replayed), "skipped": list(report.skipped)})
    else:
        click.echo(f"replayed {letters(len(report.replayed))}" + (
            f"; skipped {len(report.skipped)}" if report.skipped else ""))
    tell_skipped(report.skipped)
    if job_ids and report.skipped:  # a script must tell a typo from a replay
        raise click.exceptions.Exit(1)


@dlq.command()
@click.argument("job_ids", nargs=-1)
@connection_options
@filter_options
@reports_errors
def delete(job_ids: tuple[str, ...], framework: str, app: str | None, broker: str | None,
           options: tuple[str, ...], as_json: bool, queue: str | None, task_type: str | None,
           error_type: str | None, since: str | None, until: str | None) -> None:
    """Delete the given dead jobs (by id or filter)."""
    filters = selection(queue, task_type, error_type, since, until, job_ids)
    if filters.is_empty:
        raise click.UsageError("give job ids or a filter (purge removes everything)")
    with _opened(framework, app, broker, options, queue) as queue_:
        report = queue_.delete(filters)
        note = partial_note(queue_, queue, app)
    tell(note)
    if as_json:
        print_json({"deleted": list(report.deleted), "skipped": list(report.skipped)})
    else:
        click.echo(f"deleted {len(report.deleted)}")
    tell_skipped(report.skipped)  # a script must tell a typo from a delete
    if job_ids and not report.deleted:  # none of the ids named a dead letter here
        raise click.exceptions.Exit(1)


@dlq.command()
@connection_options
@filter_options
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@reports_errors
def purge(framework: str, app: str | None, broker: str | None, options: tuple[str, ...],
          as_json: bool, queue: str | None, task_type: str | None, error_type: str | None,
          since: str | None, until: str | None, yes: bool) -> None:
    """Delete every dead letter (of --queue, or matching the filters)."""
    filters = selection(queue, task_type, error_type, since, until)
    if not yes:
        click.confirm(f"Delete every matching dead letter ({framework})?", abort=True)
    with _opened(framework, app, broker, options, queue) as queue_:
        removed = queue_.purge(filters)
        note = partial_note(queue_, queue, app)
    tell(note)
    print_json({"purged": removed}) if as_json else click.echo(f"purged {removed}")


@dlq.command()
@connection_options
@click.option("--queue", help="Only look at this queue.")
@click.option("--max-age", default=format_duration(DEFAULT_MAX_AGE), show_default=True,
              help="ISO 8601 duration; older dead letters go. 'none' keeps any age.")
@click.option("--max-count", default=str(DEFAULT_MAX_COUNT), show_default=True,
              help="Most dead letters kept per queue (newest); 'none' for no limit.")
@reports_errors
def prune(framework: str, app: str | None, broker: str | None, options: tuple[str, ...],
          as_json: bool, queue: str | None, max_age: str, max_count: str) -> None:
    """Apply retention now: drop dead letters past --max-age, then the oldest past --max-count."""
    retention = Retention(
        max_age=None if max_age == "none" else duration_option(max_age, "max-age"),
        max_count=None if max_count == "none" else int(max_count))
    with _opened(framework, app, broker, options, queue) as queue_:
        removed = queue_.prune(retention, queue=queue)
        note = partial_note(queue_, queue, app)
    tell(note)
    print_json({"pruned": removed}) if as_json else click.echo(f"pruned {removed}")
