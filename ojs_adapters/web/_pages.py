"""The console's pages (GET only): overview, waiting retries, dead letters, a dead letter, a job.

Every page is a shareable URL: what it shows is in its query string. Nothing here
changes state (``_actions`` does, by POST). Text from a job (error messages and
types, headers) reaches the page only through Jinja2's autoescaping.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ojs_adapters.history import JobRecord, utc_now
from ojs_adapters.runtime.browse import WaitingFilter
from ojs_adapters.runtime.dlq import Coverage, DeadLetterFilter, entry_rounds, round_starts
from ojs_adapters.web import _overview
from ojs_adapters.web._console import Console
from ojs_adapters.web._trouble import bad_input, trouble

#: Rows per page.
PER_PAGE = 50


def console_of(request: Request) -> Console:
    console: Console = request.app.state.console
    return console


def _guarded(view: Callable[[Request, Console], Response]) -> Callable[[Request], Response]:
    """Run ``view``; a broker or store error becomes a 503 page that says what failed."""

    def run(request: Request) -> Response:
        console = console_of(request)
        try:
            return view(request, console)
        except ValueError as error:  # a bad query parameter
            return bad_input(console, request, error)
        except Exception as error:
            return trouble(console, request, error)

    run.__name__ = view.__name__
    return run


def _page_number(request: Request) -> int:
    raw = request.query_params.get("page") or "1"
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError("page must be a whole number from 1")
    return int(raw)


@_guarded
def overview(request: Request, console: Console) -> Response:
    window = "day" if request.query_params.get("window") == "day" else "hour"
    with console.lock:
        with console.backend() as backend:
            depths = backend.depths()
            partial = coverage_note(backend.dead_letters.coverage())
        sources = console.retries().sources()
        stats = console.stats()
        rows: list[_overview.Row] = []
        chart = None
        if stats is not None:
            minutes, hours = _overview.read(stats, console.settings.framework)
            rows = _overview.summarize(minutes, hours)
            chart = _overview.chart(_overview.series(minutes if window == "hour" else hours),
                                    seconds_per_bucket=60 if window == "hour" else 3600)
    return console.render(request, "overview.html", title="Overview", depths=depths,
                          sources=sources, rows=rows, chart=chart, window=window,
                          stats_on=stats is not None, colours=_overview.COLOURS, partial=partial,
                          labels=_overview.LABELS, refresh=True)


@_guarded
def waiting(request: Request, console: Console) -> Response:
    params = request.query_params
    filters = WaitingFilter(queue=params.get("queue") or None, task=params.get("task") or None)
    number = _page_number(request)
    with console.lock:
        view = console.retries()
        sources = view.sources()
        listable = [s.name for s in sources if s.listable]
        source = params.get("source") or (listable[0] if listable else "")
        current = next((s for s in sources if s.name == source), None)
        page = view.page(source, filters, page=number, per_page=PER_PAGE) \
            if current is not None and current.listable else None
    return console.render(request, "waiting.html", title="Waiting retries", sources=sources,
                          source=source, current=current, page=page, filters=filters,
                          now=utc_now(), due_in=_due_in, refresh=True, notice=_notice(request))


def letter_filter(params: Any) -> DeadLetterFilter:
    """The dead-letter filter a query string (or form) describes."""
    return DeadLetterFilter(queue=params.get("queue") or None,
                            task_type=params.get("task") or None,
                            error_type=params.get("error") or None,
                            since=_moment(params.get("since"), "since"),
                            until=_moment(params.get("until"), "until"))


@_guarded
def letters(request: Request, console: Console) -> Response:
    filters = letter_filter(request.query_params)
    number = _page_number(request)
    with console.backend() as backend:
        page = backend.letters(filters, page=number, per_page=PER_PAGE)
        queues = sorted(backend.depths())
        partial = None if filters.queue else coverage_note(backend.dead_letters.coverage())
    return console.render(request, "letters.html", title="Dead letters", page=page,
                          filters=filters, queues=queues, params=request.query_params,
                          notice=_notice(request), partial=partial)


def coverage_note(coverage: Coverage) -> str | None:
    """What to say when the look for dead-letter queues may have missed some (RabbitMQ
    cannot list queues over AMQP), and how to see them all; ``None`` when it saw all."""
    if coverage.complete:
        return None
    fix = ("let the console list the broker's queues through the RabbitMQ management API "
           "(the rabbitmq_management plugin enabled, the AMQP user tagged 'management', "
           "--option management=URL where the API is not beside the broker), or name them "
           "with --queue NAME" if "RabbitMQ" in coverage.source else
           "name them with --queue NAME")
    return (f"Not every dead-letter queue may have been seen, so dead letters may be "
            f"missing here; {coverage.describe()}. To see them all, {fix}.")


@_guarded
def letter(request: Request, console: Console) -> Response:
    job_id = request.query_params.get("id", "")
    queue = request.query_params.get("queue") or None
    with console.backend() as backend:
        found = backend.letter(job_id, queue, request.query_params.get("key") or None) \
            if job_id else None
        details = backend.describe(found) if found is not None else None
    if found is None:
        return console.render(request, "error.html", 404, title="Not found",
                              error=f"no dead letter of job {job_id!r}")
    return console.render(request, "letter.html", title=f"Dead letter {job_id}",
                          letter=found, details=details,
                          starts=round_starts(found.history, found.replay_count))


@_guarded
def job(request: Request, console: Console) -> Response:
    job_id = request.query_params.get("id", "").strip()
    record = None
    if job_id:
        with console.backend() as backend:
            record = backend.record(job_id)
    return console.render(request, "job.html", title=f"Job {job_id}" if job_id else "Job",
                          job_id=job_id, record=record,
                          timeline=timeline(record) if record else [])


def metrics(request: Request) -> Response:
    """``ojs_dead_letter_depth{framework,queue}``, ``ojs_dead_letter_depth_error`` and
    ``ojs_dead_letter_depth_complete`` in the Prometheus text format."""
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    from ojs_adapters.runtime.alerts import DeadLetterDepth

    console = console_of(request)
    looked: list[Coverage] = []

    def depths() -> dict[str, int]:
        with console.backend() as backend:
            found = backend.depths()
            looked.append(backend.dead_letters.coverage())  # the look ``depths`` made
            return found

    registry = CollectorRegistry()
    registry.register(DeadLetterDepth(console.settings.framework, depths,
                                      complete=lambda: looked[-1].complete))
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


def timeline(record: JobRecord) -> list[dict[str, Any]]:
    """One row per failed attempt: the entry, the round it ran in (``new_round`` where a
    dead-letter replay started one, its attempts counted from 1 again), the countdown
    asked after it, the gap observed to the next failure of its round (that countdown
    plus the next attempt's run time). Countdowns are the current round's only."""
    countdowns = list(record.extra.get("countdowns") or [])
    current = record.extra.get("replay_count")
    current = current if isinstance(current, int) and current > 0 else 0
    rounds = entry_rounds(record.errors, current)
    starts = round_starts(record.errors, current)
    rows = []
    for i, entry in enumerate(record.errors):
        asked = None
        if rounds[i] == current and 0 < entry.attempt <= len(countdowns):
            asked = countdowns[entry.attempt - 1]
        gap = None
        if i + 1 < len(record.errors) and rounds[i + 1] == rounds[i]:
            gap = (_parse(record.errors[i + 1].occurred_at) -
                   _parse(entry.occurred_at)).total_seconds()
        rows.append({"entry": entry, "asked": asked, "gap": gap, "round": rounds[i],
                     "new_round": starts[i] is not None})
    return rows


def _parse(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def _moment(value: str | None, field: str) -> datetime | None:
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{field} must be a date (YYYY-MM-DD or ISO 8601 with a time), "
                         f"not {value!r}") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def _due_in(moment: datetime | None, now: datetime) -> str:
    if moment is None:
        return "?"
    seconds = (moment - now).total_seconds()
    if seconds <= 0:
        return "due now"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


#: What a ``notice`` query parameter may say after an action (never free text).
NOTICES = {"replayed": "Replayed {n} dead letter(s).", "deleted": "Deleted {n} dead letter(s).",
           "retried": "{n} waiting retry(ies) will run now.",
           "discarded": "Discarded {n} waiting retry(ies).", "changed":
           "Nothing done: the selection changed since the confirmation. Look and try again."}


def _notice(request: Request) -> str | None:
    kind = request.query_params.get("notice")
    count = request.query_params.get("n", "0")
    if kind not in NOTICES:
        return None
    return NOTICES[kind].format(n=int(count) if count.isdigit() else 0)
