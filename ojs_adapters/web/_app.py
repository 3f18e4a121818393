"""The console application: one Starlette app over one framework's ``ConsoleBackend``.

``create_app`` wires the pages (``_pages``) and actions (``_actions``) to one shared
``Console`` (``_console``), which opens the backend at the first request. Every
response carries a strict Content-Security-Policy (scripts from the console's own
``/static`` only, no inline script, no eval), so even text that escaped escaping
could not run.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ojs_adapters.runtime.browse import ConsoleBackend, open_console_backend
from ojs_adapters.web import _actions, _pages
from ojs_adapters.web._console import Console
from ojs_adapters.web._security import CSRF_COOKIE, Guard
from ojs_adapters.web._settings import ConsoleSettings

logger = logging.getLogger("ojs_adapters.web")

# ``Console`` lives in ``_console`` (the pages and actions use it); kept importable from here.
__all__ = ["SECURITY_HEADERS", "Console", "create_app"]

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


class _Protect(BaseHTTPMiddleware):
    """Security headers on every response, and a CSRF cookie for every browser."""

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        nonce = request.cookies.get(CSRF_COOKIE)
        request.state.csrf_nonce = nonce or Guard.new_nonce()
        # the console's root, read before routing: a Mount (/static) moves root_path on
        root = str(request.scope.get("root_path", "")) or "/"
        response = await call_next(request)
        response.headers.update(SECURITY_HEADERS)
        if not nonce:
            response.set_cookie(CSRF_COOKIE, request.state.csrf_nonce, httponly=True,
                                samesite="strict", path=root,
                                secure=request.url.scheme == "https")
        return response


def create_app(settings: ConsoleSettings, *,
               opener: Callable[[], ConsoleBackend] | None = None) -> Starlette:
    """The console as an ASGI app; mount it anywhere (see ``ojs_adapters.web``).

    ``opener`` opens the backend (default: the one ``settings`` names).
    """
    console = Console(settings, opener or (lambda: open_console_backend(
        settings.framework, app=settings.app, broker=settings.broker,
        queues=settings.queues, options=settings.options)))
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

    hosts = Middleware(TrustedHostMiddleware, allowed_hosts=list(settings.allowed_hosts),
                       www_redirect=False)
    app = Starlette(routes=routes, middleware=[hosts, Middleware(_Protect)], lifespan=lifespan)
    app.state.console = console
    return app
