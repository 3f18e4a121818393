"""The console's actions: a confirmation page (GET) that says how many, then the POST.

Dead letters: replay or delete, by ids or over a filter, through the
``ojs_adapters.runtime.dlq`` API (the one ``ojs-retry dlq`` uses). A filter's count is
taken at confirmation and checked again before acting: if it moved, nothing is done
and the operator looks again. Waiting retries: retry now or discard, where the
source is actionable. Every POST passes ``Guard.allow`` (token and CSRF token) or
gets a 403, and every action is audited (who, what; never arguments).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from ojs_adapters.runtime.dlq import DeadLetterFilter
from ojs_adapters.web._console import Console, qs
from ojs_adapters.web._pages import console_of, letter_filter
from ojs_adapters.web._security import CSRF_COOKIE, SESSION_COOKIE, Forbidden, audit
from ojs_adapters.web._trouble import bad_input, trouble, whole_number

#: Actions and how the confirmation names them.
LETTER_ACTIONS = {"replay": "Replay", "delete": "Delete"}
WAITING_ACTIONS = {"retry_now": "Run now", "discard": "Discard"}


def _client(request: Request) -> str:
    return request.client.host if request.client else "?"


def _forbidden(console: Console, request: Request, why: str) -> Response:
    return console.render(request, "error.html", 403, title="Forbidden", error=why)


def _filter_fields(filters: DeadLetterFilter) -> dict[str, str]:
    return {k: v for k, v in {
        "queue": filters.queue or "", "task": filters.task_type or "",
        "error": filters.error_type or "",
        "since": filters.since.isoformat() if filters.since else "",
        "until": filters.until.isoformat() if filters.until else ""}.items() if v}


def confirm(request: Request) -> Response:
    """How many the action will touch, and the button that does it (POST)."""
    console = console_of(request)
    if not console.settings.writable or console.guard.who(request) is None:
        return _forbidden(console, request, "actions need the operator token (log in)"
                          if console.settings.writable else "this console is read-only")
    params = request.query_params
    action = params.get("action", "")
    ids = [i for i in params.getlist("id") if i]
    if action in WAITING_ACTIONS:
        return console.render(request, "confirm.html", title="Confirm", kind="waiting",
                              action=action, verb=WAITING_ACTIONS[action], ids=ids,
                              count=len(ids), source=params.get("source", ""), fields={},
                              what="waiting retry",
                              back=f"/waiting{qs(source=params.get('source'))}")
    if action not in LETTER_ACTIONS:
        return console.render(request, "error.html", 400, title="Bad request",
                              error="unknown action")
    try:
        filters = letter_filter(params)
    except ValueError as error:
        return bad_input(console, request, error)
    if ids:
        count = len(set(ids))
    else:
        try:
            with console.backend() as backend:
                count = backend.letters(filters, per_page=1).total
        except Exception as error:
            return trouble(console, request, error)
    fields = _filter_fields(filters)
    return console.render(request, "confirm.html", title="Confirm", kind="letters",
                          action=action, verb=LETTER_ACTIONS[action], ids=ids, count=count,
                          source="", fields=fields, what="dead letter",
                          back=f"/dead-letters{qs(**fields)}")


async def act_on_letters(request: Request) -> Response:
    console = console_of(request)
    form = await request.form()
    try:
        who = console.guard.allow(request, form)
    except Forbidden as why:
        return _forbidden(console, request, str(why))
    action = str(form.get("action", ""))
    if action not in LETTER_ACTIONS:
        return console.render(request, "error.html", 400, title="Bad request",
                              error="unknown action")
    ids = [str(i) for i in form.getlist("id") if i]
    try:
        filters = letter_filter(form)
        expected = whole_number(str(form.get("expected", "")) or "0", "expected")
    except ValueError as error:
        return bad_input(console, request, error)

    def act() -> tuple[str, int]:
        with console.backend() as backend:
            dlq = backend.dead_letters
            if ids:
                selection = DeadLetterFilter(queue=filters.queue, ids=frozenset(ids))
                if action == "replay":
                    return "replayed", len(dlq.replay(selection).replayed)
                return "deleted", len(dlq.delete(selection).deleted)
            # "all N": exactly the N counted, not one that arrived since the page was shown
            counted = backend.letters(filters, per_page=max(expected, 1))
            if counted.total != expected:
                return "changed", 0
            if action == "replay":
                return "replayed", len(dlq.replay(filters, limit=expected).replayed)
            if not counted.items:
                return "deleted", 0
            # the operator's filter still applies: another letter of one of these jobs (a
            # task id used twice) that it leaves out stays
            return "deleted", len(dlq.delete(replace(filters, ids=frozenset(
                x.id for x in counted.items))).deleted)

    try:
        notice, count = await run_in_threadpool(act)
    except Exception as error:
        audit(who, _client(request), f"dead-letters.{action}",
              framework=console.settings.framework, ids=ids, expected=expected,
              outcome=f"failed: {type(error).__name__}")
        return trouble(console, request, error, acting=True)
    audit(who, _client(request), f"dead-letters.{action}", framework=console.settings.framework,
          ids=ids, filter=_filter_fields(filters) if not ids else None, expected=expected,
          count=count, outcome=notice)
    fields = _filter_fields(filters) if not ids else {"queue": filters.queue or ""}
    return _back(request, "/dead-letters", notice=notice, n=count, **fields)


async def act_on_waiting(request: Request) -> Response:
    console = console_of(request)
    form = await request.form()
    try:
        who = console.guard.allow(request, form)
    except Forbidden as why:
        return _forbidden(console, request, str(why))
    action = str(form.get("action", ""))
    source = str(form.get("source", ""))
    ids = [str(i) for i in form.getlist("id") if i]
    if action not in WAITING_ACTIONS or not ids:
        return console.render(request, "error.html", 400, title="Bad request",
                              error="unknown action, or no retry chosen")

    def act() -> int:
        with console.lock:
            view = console.retries()
            if action == "retry_now":
                return view.retry_now(source, ids)
            return view.discard(source, ids)

    try:
        count = await run_in_threadpool(act)
    except Exception as error:
        audit(who, _client(request), f"waiting.{action}", framework=console.settings.framework,
              source=source, ids=ids, outcome=f"failed: {type(error).__name__}")
        return trouble(console, request, error, acting=True)
    audit(who, _client(request), f"waiting.{action}", framework=console.settings.framework,
          source=source, ids=ids, count=count)
    return _back(request, "/waiting", source=source,
                 notice="retried" if action == "retry_now" else "discarded", n=count)


def _back(request: Request, path: str, **params: Any) -> Response:
    base = str(request.scope.get("root_path", "")).rstrip("/")
    return RedirectResponse(f"{base}{path}{qs(**params)}", status_code=303)


async def login(request: Request) -> Response:
    console = console_of(request)
    if not console.settings.tokens:
        return console.render(request, "error.html", 404, title="No login",
                              error="no operator token is configured: the console is "
                                    "read-only, or the host application signs you in")
    if request.method == "GET":
        return console.render(request, "login.html", title="Log in", failed=False)
    form = await request.form()
    if not console.guard.check_csrf(request.cookies.get(CSRF_COOKIE, ""),
                                    str(form.get("csrf", ""))):
        return _forbidden(console, request, "missing or invalid CSRF token: reload the page")
    name = console.guard.login(str(form.get("token", "")))
    audit(name or "?", _client(request), "login", outcome="ok" if name else "refused")
    if name is None:
        return console.render(request, "login.html", 403, title="Log in", failed=True)
    response = _back(request, "/")
    base = str(request.scope.get("root_path", "")) or "/"
    response.set_cookie(SESSION_COOKIE, console.guard.session(name), httponly=True,
                        samesite="strict", path=base, secure=request.url.scheme == "https")
    return response


async def logout(request: Request) -> Response:
    console = console_of(request)
    form = await request.form()
    if not console.guard.check_csrf(request.cookies.get(CSRF_COOKIE, ""),
                                    str(form.get("csrf", ""))):
        return _forbidden(console, request, "missing or invalid CSRF token")
    response = _back(request, "/")
    response.delete_cookie(SESSION_COOKIE, path=str(request.scope.get("root_path", "")) or "/")
    return response
