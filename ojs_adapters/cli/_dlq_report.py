"""What ``ojs-retry dlq`` says besides its results: notes, skipped ids, failures.

A broker's failure is one sentence (``runtime.broker_errors``), exit 1; bad input its message,
exit 1; a bug in ojs-retry says so, exit 70 (``EXIT_INTERNAL``), never a traceback.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import click

from ojs_adapters.cli._io import EXIT_INTERNAL
from ojs_adapters.errors import OjsError
from ojs_adapters.runtime.broker_errors import broker_failure, hide_password
from ojs_adapters.runtime.dlq import DeadLetterQueue

P = ParamSpec("P")
R = TypeVar("R")


def failure(exc: Exception, broker: str | None, app: str | None,
            found: str | None) -> click.ClickException:
    """A broker's failure as a sentence (exit 1); else a bug, in Python's words (exit 70)."""
    url = broker or found
    where = f"the broker at {hide_password(url)}" if url else f"the broker of --app {app}"
    said = broker_failure(exc, where)
    if said is None:
        return Internal(f"internal error in ojs-retry: {type(exc).__name__}: {exc} "
                        "(please report it)")
    return click.ClickException(said)


class Internal(click.ClickException):
    """A bug in ojs-retry: exit ``EXIT_INTERNAL``, as every verb does."""

    exit_code = EXIT_INTERNAL


def partial_note(found: DeadLetterQueue, queue: str | None, app: str | None) -> str | None:
    """What to say when the look may have missed dead-letter queues; ``None`` if it did not."""
    if queue is not None:
        return None
    coverage = found.coverage()
    if coverage.complete:
        return None
    hint = "--queue NAME" if app else "--queue NAME or --app MODULE"
    return (f"note: not every dead-letter queue may have been seen; {coverage.describe()}; "
            f"pass {hint} to look elsewhere")


def tell(note: str | None) -> None:
    """Print ``note`` on stderr, if there is one."""
    if note:
        click.echo(note, err=True)


def reports_errors(command: Callable[P, R]) -> Callable[P, R]:
    """Turn what a verb raises into one line and its exit status, never a traceback."""
    @functools.wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except (OjsError, ValueError) as exc:  # bad input: its message alone
            raise click.ClickException(str(exc)) from None
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as exc:  # one line, not a traceback
            broker, app = (kwargs.get(name) for name in ("broker", "app"))
            raise failure(exc, str(broker) if broker else None, str(app) if app else None,
                          None) from None

    return wrapper


def tell_skipped(skipped: tuple[str, ...]) -> None:
    """Name on stderr the ids asked for that named no dead letter (a typo, or gone meanwhile)."""
    if skipped:
        click.echo(f"not (or no longer) dead letters here: {', '.join(sorted(set(skipped)))}",
                   err=True)


def letters(count: int) -> str:
    """``1 dead letter``, ``2 dead letters``."""
    return f"{count} dead letter" + ("" if count == 1 else "s")
