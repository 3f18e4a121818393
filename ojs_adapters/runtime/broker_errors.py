"""A broker's failure as a sentence: which broker (password hidden), what failed, what to check.

The CLI and the console say it the same way.

The core imports no client library, so a failure is read from the names of its type
and its text: pika, py-amqp, kombu and redis-py spell the same few failures (login
refused, no such vhost, nothing listening) each their own way.

>>> hide_password("amqp://guest:secret@rabbit:5672/%2F")
'amqp://guest:***@rabbit:5672/%2F'
>>> said = broker_failure(ConnectionRefusedError(111, "Connection refused"),
...                         "the broker at redis://h:6390/0")
>>> said.split(": ")[0]
'cannot connect to the broker at redis://h:6390/0 (Connection refused)'
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

#: Text of a refused login: RabbitMQ (pika, py-amqp), Redis ACLs and passwords.
_LOGIN = re.compile(r"ACCESS_REFUSED|Login was refused|WRONGPASS|NOAUTH|invalid username|"
                    r"Authentication required|invalid password", re.IGNORECASE)
#: Text of a vhost RabbitMQ does not have, or will not let this user open.
_VHOST = re.compile(r"NOT_ALLOWED|vhost\b.*\bnot found|access to vhost", re.IGNORECASE)
#: A client's type and context before its message: ``ConnectionClosedByBroker: ``,
#: py-amqp's ``(0, 0): `` and ``Connection.open: ``.
_PREFIX = re.compile(r"^(?:[A-Z]\w*(?:\.\w+)?: |\(\d+, \d+\): )+")
#: An AMQP reply code before RabbitMQ's text: ``(403) ``.
_CODE = re.compile(r"^\(\d+\) ")
#: A nested exception's repr, ``ConnectionRefusedError(111, 'Connection refused')``.
_NESTED = re.compile(r"\b[A-Z]\w*(?:Error|Exception)\((?:-?\d+, )?'([^']*)'\)")


def hide_password(url: str) -> str:
    """``url`` (or several, ``;``-separated) with any password replaced by ``***``.

    >>> hide_password("redis://:pw@h:6379/0;amqp://h//")
    'redis://:***@h:6379/0;amqp://h//'
    """
    return ";".join(_hide_one(part) for part in url.split(";"))


def _hide_one(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user, _, host = parts.netloc.rpartition("@")
    name = user.partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{name}:***@{host}"))


def broker_failure(exc: BaseException, where: str) -> str | None:
    """What went wrong at ``where`` (``"the broker at URL"``) and what to check; ``None``
    when ``exc`` does not look like a broker's failure (a bug: Python's own error types)."""
    names = " ".join(t.__name__ for t in type(exc).__mro__)
    text = f"{names} {exc} {' '.join(map(str, exc.args))}"
    detail = _detail(exc)
    said = f" ({detail.rstrip('.')})" if detail else ""
    if _VHOST.search(text) or "AccessDenied" in names or "NotAllowed" in names:
        return (f"{where} refused the vhost{said}: check that the vhost in the URL exists and "
                "that the user may use it (amqp://HOST// and amqp://HOST/%2F are vhost '/')")
    if _LOGIN.search(text) or "Authentication" in names or "AccessRefused" in names:
        return f"{where} refused the login{said}: check the user name and password"
    if isinstance(exc, OSError) or re.search(r"Connection|Timeout|OperationalError", names):
        return (f"cannot connect to {where}{said}: is it running, and "
                "reachable at that host and port?")
    if type(exc).__module__ == "builtins":
        return None
    return f"{where} failed{said}: check the broker's logs, and that it is healthy"


def _detail(exc: BaseException) -> str:
    """The message of ``exc`` without the type names clients put before it."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = str(exc) or "; ".join(str(arg) or repr(arg) for arg in exc.args)  # pika's nest
    text = _NESTED.sub(r"\1", _PREFIX.sub("", text.strip())).strip()
    return _CODE.sub("", text).strip("'\"")
