"""The console application: one Starlette app over one framework's ``ConsoleBackend``.

The backend is opened once, at the first request (so ``create_app`` is cheap and
an app that cannot reach its broker still starts and says why), and used under one
lock: kombu and pika connections are not thread-safe, and Starlette runs the sync
views in a thread pool. Every response carries a strict Content-Security-Policy
(scripts from the console's own ``/static`` only, no inline script, no eval), so
even text that escaped escaping could not run.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any
from urllib.parse import urlencode

import jinja2
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ojs_adapters.runtime.browse import ConsoleBackend, RetryView, open_console_backend
from ojs_adapters.runtime.stats import StatsReader
from ojs_adapters.web._security import CSRF_COOKIE, Guard
from ojs_adapters.web._settings import ConsoleSettings

logger = logging.getLogger("ojs_adapters.web")

#: Sent with every response.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "img-src 'self'; connect-src 'self'; form-action 'self'; "
                               "base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


class Console:
    """The state one console app shares between requests."""

    def __init__(self, settings: ConsoleSettings,
                 opener: Callable[[], ConsoleBackend] | None = None) -> None:
        self.settings = settings
        self.guard = Guard(settings)
        self._opener = opener or (lambda: open_console_backend(
            settings.framework, app=settings.app, broker=settings.broker,
            queues=settings.queues, options=settings.options))
        self._backend: ConsoleBackend | None = None
        self._retries: RetryView | None = None
        self._stats: StatsReader | None = None
        self.lock = threading.RLock()
        self.templates = jinja2.Environment(
            loader=jinja2.PackageLoader("ojs_adapters.web", "templates"), autoescape=True,
            undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)

    @contextmanager
    def backend(self) -> Iterator[ConsoleBackend]:
        """The backend, opened on first use, held under the lock."""
        with self.lock:
            if self._backend is None:
                self._backend = self._opener()
            yield self._backend

    def retries(self) -> RetryView:
        with self.backend() as backend:
            if self._retries is None:
                self._retries = backend.retry_view(self.stats())
            return self._retries

    def stats(self) -> StatsReader | None:
        """The statistics reader: ``stats_url``, else the backend's Redis, else ``None``."""
        if self._stats is None:
            client = None
            if self.settings.stats_url:
                import redis

                client = redis.Redis.from_url(self.settings.stats_url)
            else:
                with self.backend() as backend:
                    client = backend.stats_client()
            if client is not None:
                self._stats = StatsReader(client, prefix=self.settings.stats_prefix)
        return self._stats

    def close(self) -> None:
        with self.lock:
            if self._backend is not None:
                self._backend.close()
            self._backend = None
            self._retries = None

    def render(self, request: Request, name: str, status_code: int = 200,
               **context: Any) -> HTMLResponse:
        """Render template ``name`` with what every page needs."""
        base = str(request.scope.get("root_path", "")).rstrip("/")
        nonce = request.cookies.get(CSRF_COOKIE) or request.state.csrf_nonce
        who = self.guard.who(request) if self.settings.writable else None
        page = self.templates.get_template(name).render(
            request=request, base=base, settings=self.settings, who=who,
            can_act=who is not None, writable=self.settings.writable,
            csrf=self.guard.csrf_token(nonce), qs=_qs, path=request.url.path,
            page_link=lambda n: _qs(**{**_kept(request), "page": n}), **context)
        return HTMLResponse(page, status_code=status_code)


def _qs(**params: Any) -> str:
    """A query string of the non-empty ``params`` (``?a=1&b=x``), or ``""``."""
    kept = {k: v for k, v in params.items() if v not in (None, "")}
    return "?" + urlencode(kept, doseq=True) if kept else ""


def _kept(request: Request) -> dict[str, Any]:
    """The query parameters a pager link keeps (not the one-off ``notice``)."""
    return {k: v for k, v in request.query_params.items() if k not in ("page", "notice", "n")}


class _Protect(BaseHTTPMiddleware):
    """Security headers on every response, and a CSRF cookie for every browser."""

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        nonce = request.cookies.get(CSRF_COOKIE)
        request.state.csrf_nonce = nonce or Guard.new_nonce()
        response = await call_next(request)
        response.headers.update(SECURITY_HEADERS)
        if not nonce:
            root = str(request.scope.get("root_path", "")) or "/"
            response.set_cookie(CSRF_COOKIE, request.state.csrf_nonce, httponly=True,
                                samesite="strict", path=root,
                                secure=request.url.scheme == "https")
        return response


def create_app(settings: ConsoleSettings, *,
               opener: Callable[[], ConsoleBackend] | None = None) -> Starlette:
    """The console as an ASGI app; mount it anywhere (see ``ojs_adapters.web``)."""
    from ojs_adapters.web import _actions, _pages

    console = Console(settings, opener)
    routes = [
        Route("/", _pages.overview, name="overview"),
        Route("/waiting", _pages.waiting, name="waiting"),
        Route("/dead-letters", _pages.letters, name="letters"),
        Route("/dead-letter", _pages.letter, name="letter"),
        Route("/jobs", _pages.job, name="job"),
        Route("/metrics", _pages.metrics, name="metrics"),
        Route("/confirm", _actions.confirm, name="confirm"),
        Route("/actions/dead-letters", _actions.act_on_letters, methods=["POST"]),
        Route("/actions/waiting", _actions.act_on_waiting, methods=["POST"]),
        Route("/login", _actions.login, methods=["GET", "POST"], name="login"),
        Route("/logout", _actions.logout, methods=["POST"]),
        Mount("/static", StaticFiles(packages=[("ojs_adapters.web", "static")]),
              name="static"),
    ]
    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        yield
        console.close()

    app = Starlette(routes=routes, middleware=[Middleware(_Protect)], lifespan=lifespan)
    app.state.console = console
    return app
