"""The operator console: waiting retries, dead letters and decisions, for Celery and Dramatiq.

``ojs-retry web --framework celery --app myapp:app`` serves it on 127.0.0.1:8642.
The same app mounts under a prefix in an ASGI application::

    from ojs_adapters.web import ConsoleSettings, create_app
    console = create_app(ConsoleSettings(framework="dramatiq", app="myapp:broker",
                                         auth=lambda request: my_user_name(request)))
    fastapi_app.mount("/ojs", console)          # FastAPI or Starlette

or, through ``wsgi_app``, in a WSGI one (Flask, Django), naming the ``Host`` names it
answers (the dispatcher routes ``/ojs`` before the host app's own host check)::

    settings = ConsoleSettings(framework="celery", app="myapp:app",
                               allowed_hosts=["ops.example.com", "localhost"])
    from werkzeug.middleware.dispatcher import DispatcherMiddleware
    flask_app.wsgi_app = DispatcherMiddleware(flask_app.wsgi_app,
                                              {"/ojs": wsgi_app(settings)})

Read-only unless ``tokens`` or an ``auth`` callable is configured (see
``_security``). Statistics come from ``ojs_adapters.runtime.stats.enable_stats`` in the
workers; the dead-letter depth gauge is at ``/metrics``.
"""

from __future__ import annotations

from typing import Any

from ojs_adapters.web._app import create_app
from ojs_adapters.web._console import Console
from ojs_adapters.web._settings import ConsoleSettings, read_tokens


def wsgi_app(settings: ConsoleSettings) -> Any:
    """The console as a WSGI application (``a2wsgi`` over ``create_app``)."""
    from a2wsgi import ASGIMiddleware

    return ASGIMiddleware(create_app(settings))  # type: ignore[arg-type]


__all__ = ["Console", "ConsoleSettings", "create_app", "read_tokens", "wsgi_app"]
