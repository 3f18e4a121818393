"""``Console``: the state one console app shares between requests, and its page helpers.

The backend is opened once, at the first request (so ``create_app`` is cheap and
an app that cannot reach its broker still starts and says why), and used under one
lock: kombu and pika connections are not thread-safe, and Starlette runs the sync
views in a thread pool. The pages (``_pages``) and actions (``_actions``) reach it as
``request.app.state.console``; ``_app`` builds it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlencode

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse

from ojs_adapters.runtime.browse import ConsoleBackend, RetryView
from ojs_adapters.runtime.stats import StatsReader
from ojs_adapters.web._security import CSRF_COOKIE, Guard
from ojs_adapters.web._settings import ConsoleSettings


class Console:
    """The state one console app shares between requests; ``opener`` opens its backend
    (``create_app`` passes the one its settings name, ``open_console_backend``)."""

    def __init__(self, settings: ConsoleSettings, opener: Callable[[], ConsoleBackend]) -> None:
        self.settings = settings
        self.guard = Guard(settings)
        self._opener = opener
        self._backend: ConsoleBackend | None = None
        self._retries: RetryView | None = None
        self._stats: StatsReader | None = None
        self.lock = threading.RLock()
        self.templates = jinja2.Environment(
            loader=jinja2.PackageLoader("ojs_adapters.web", "templates"), autoescape=True,
            undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
        # ``tojson`` of a job's arguments: a datetime or UUID kombu decoded shows as its str
        self.templates.policies["json.dumps_kwargs"] = {"sort_keys": True, "default": str}

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
            csrf=self.guard.csrf_token(nonce), qs=qs, path=request.url.path,
            page_link=lambda n: qs(**{**_kept(request), "page": n}), **context)
        return HTMLResponse(page, status_code=status_code)


def qs(**params: Any) -> str:
    """A query string of the non-empty ``params`` (``?a=1&b=x``), or ``""``."""
    kept = {k: v for k, v in params.items() if v not in (None, "")}
    return "?" + urlencode(kept, doseq=True) if kept else ""


def _kept(request: Request) -> dict[str, Any]:
    """The query parameters a pager link keeps (not the one-off ``notice``)."""
    return {k: v for k, v in request.query_params.items() if k not in ("page", "notice", "n")}
