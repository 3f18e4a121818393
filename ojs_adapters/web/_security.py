"""Who may change anything, and the proof each state-changing request must carry.

Safe by default: with no token and no auth callable the console is read-only, no
action button is rendered, and every action is refused (403). Otherwise each
state-changing request is a POST that carries:

- the operator's identity: a session cookie from ``/login`` (the name percent-encoded,
  and an HMAC of the name, an expiry and a fingerprint of the token, so rotating a
  token ends its sessions),
  an ``Authorization: Bearer <token>`` header, or whatever the host application's
  auth callable accepts;
- a CSRF token: the HMAC of a random cookie (``SameSite=Strict``), in the form
  field ``csrf``; a cross-site page can neither read the cookie nor forge the field.

An ``Origin`` header naming another host is refused too. Every action is logged
on ``ojs_adapters.web.audit``: who, from where, what (ids, queue, filter, count),
never job arguments.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from ojs_adapters.web._settings import ConsoleSettings

#: The audit log: one record per action.
audit_log = logging.getLogger("ojs_adapters.web.audit")
SESSION_COOKIE = "ojs_session"
CSRF_COOKIE = "ojs_csrf"
#: Lifetime of a login session, seconds.
SESSION_SECONDS = 8 * 3600


class Forbidden(Exception):
    """A request that may not change anything; the message says why (shown to the client)."""


class Guard:
    """Checks identities and CSRF tokens for one console (see the module docstring).

    >>> guard = Guard(ConsoleSettings(framework="celery", tokens={"ops": "t" * 20},
    ...                               secret=b"k" * 32))
    >>> guard.login("t" * 20), guard.login("wrong")
    ('ops', None)
    >>> guard.check_csrf("nonce", guard.csrf_token("nonce")), guard.check_csrf("nonce", "x")
    (True, False)
    """

    def __init__(self, settings: ConsoleSettings) -> None:
        self.settings = settings
        self._secret = settings.secret

    def _sign(self, *parts: str) -> str:
        return hmac.new(self._secret, "|".join(parts).encode(), hashlib.sha256).hexdigest()

    def login(self, token: str) -> str | None:
        """The name of the operator whose token this is, or ``None`` (constant time)."""
        found = None
        for name, known in self.settings.tokens.items():
            if hmac.compare_digest(known.encode(), token.encode()):
                found = name
        return found

    def session(self, name: str, *, now: float | None = None) -> str:
        """The session cookie value for operator ``name``."""
        expires = str(int((time.time() if now is None else now) + SESSION_SECONDS))
        signature = self._sign("session", name, expires, self._print(name))
        # percent-encoded: any name (``;``, ``,``, ``|``, spaces, any script) is cookie-safe
        return f"{quote(name, safe='')}|{expires}|{signature}"

    def _print(self, name: str) -> str:
        token = self.settings.tokens.get(name, "")
        return hashlib.sha256(token.encode()).hexdigest()[:16]

    def who(self, request: Any) -> str | None:
        """The operator making ``request`` (a Starlette request), or ``None``."""
        if self.settings.auth is not None:
            try:
                name = self.settings.auth(request)
            except Exception:  # the host's callable failing grants nothing
                logging.getLogger("ojs_adapters.web").exception("auth callable failed")
                return None
            if name:
                return str(name)
        header = request.headers.get("authorization", "")
        if header.lower().startswith("bearer ") and self.settings.tokens:
            return self.login(header[7:].strip())
        return self.from_session(request.cookies.get(SESSION_COOKIE, ""))

    def from_session(self, value: str, *, now: float | None = None) -> str | None:
        """The operator a session cookie names, if it is genuine, current and its token live."""
        quoted, _, rest = value.partition("|")
        expires, _, signature = rest.partition("|")
        name = unquote(quoted)  # a malformed escape stays as it is: no signature fits it
        if not name or name not in self.settings.tokens or not expires.isdigit():
            return None
        if int(expires) < (time.time() if now is None else now):
            return None
        expected = self._sign("session", name, expires, self._print(name))
        return name if hmac.compare_digest(expected, signature) else None

    @staticmethod
    def new_nonce() -> str:
        return secrets.token_urlsafe(24)

    def csrf_token(self, nonce: str) -> str:
        """The form field value that goes with the CSRF cookie ``nonce``."""
        return self._sign("csrf", nonce)

    def check_csrf(self, nonce: str, token: str) -> bool:
        return bool(nonce) and bool(token) and hmac.compare_digest(self.csrf_token(nonce),
                                                                   token)

    def allow(self, request: Any, form: Mapping[str, Any]) -> str:
        """The operator allowed to make this state-changing request; ``Forbidden`` if none."""
        if not self.settings.writable:
            raise Forbidden("read-only console: no token or auth callable is configured")
        origin = request.headers.get("origin")
        if origin and origin != "null" and urlsplit(origin).netloc != request.headers.get(
                "host", ""):
            raise Forbidden("cross-origin request refused")
        if not self.check_csrf(request.cookies.get(CSRF_COOKIE, ""), str(form.get("csrf", ""))):
            raise Forbidden("missing or invalid CSRF token: reload the page and try again")
        who = self.who(request)
        if who is None:
            raise Forbidden("this action needs the operator token: log in first")
        return who


def audit(who: str, client: str, action: str, **what: Any) -> None:
    """Log one action: who, from where, what (never job arguments)."""
    details = " ".join(f"{k}={v!r}" for k, v in what.items() if v not in (None, "", [], ()))
    audit_log.info("console action=%s who=%s client=%s %s", action, who, client, details,
                   extra={"ojs_audit": {"action": action, "who": who, "client": client,
                                        **what}})
