"""What an operator configures for the console: where the jobs are, and who may act.

>>> ConsoleSettings(framework="celery", broker="redis://127.0.0.1:6379/0").writable
False
>>> ConsoleSettings(framework="celery", tokens={"alice": "s3cret-token-of-alice"}).writable
True
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ojs_adapters.runtime.dlq import refuse_delay_queues

#: An auth callable a host application supplies: the request (Starlette's) in, the
#: operator's name out, or ``None`` for "no write access".
AuthCallable = Callable[[Any], "str | None"]
#: Environment variable holding one operator token (named ``operator``).
TOKEN_ENV = "OJS_WEB_TOKEN"
#: Shortest token accepted: a guessable token is no protection.
MIN_TOKEN_CHARS = 16
#: What a ``Host`` pattern may be: ``*``, a name or IPv4 address (``*.`` before a domain),
#: or an IPv6 address in brackets; never a port, a scheme or a trailing dot.
_HOST_PATTERN = re.compile(r"\*|(\*\.)?[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*|\[[0-9A-Fa-f:.]+\]")


@dataclass(frozen=True)
class ConsoleSettings:
    """The console's configuration.

    ``framework`` (``celery``/``dramatiq``) with ``app`` (``module:attr``) or ``broker``
    (a URL), ``queues`` and ``options`` as ``ojs-retry dlq`` takes them. The console is
    read-only unless ``tokens`` (``{name: token}``) or ``auth`` (a host application's
    callable) is given. ``show_args`` shows job arguments on dead letters (off: they
    may hold personal data). ``stats_url``/``stats_prefix``: where the workers'
    ``enable_stats`` writes (default: the broker's, the job records' or the result
    backend's Redis).
    ``secret`` signs sessions and CSRF tokens (random per process by default).
    ``allowed_hosts``: the ``Host`` names it answers (``*.example.com`` for a domain's
    hosts); others get a 400, so a page that rebinds its DNS name to the console's
    address cannot read it. ``*`` (any) suits an ASGI host app that checks hosts around
    its mounts; mounted through WSGI dispatch, the host app's own check never sees the
    console's requests: name the hosts here.
    """

    framework: str
    app: str | None = None
    broker: str | None = None
    queues: Sequence[str] = ()
    options: Mapping[str, str] = field(default_factory=dict)
    tokens: Mapping[str, str] = field(default_factory=dict)
    auth: AuthCallable | None = None
    show_args: bool = False
    stats_url: str | None = None
    stats_prefix: str = "ojs-stats"
    refresh_seconds: int = 5
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    allowed_hosts: Sequence[str] = ("*",)

    def __post_init__(self) -> None:
        object.__setattr__(self, "allowed_hosts", host_patterns(self.allowed_hosts))
        refuse_delay_queues(self.framework, self.queues)  # DelayQueueGiven: no dead letters
        for name, token in self.tokens.items():
            if len(token) < MIN_TOKEN_CHARS:
                raise ValueError(f"the token of {name!r} is shorter than {MIN_TOKEN_CHARS} "
                                 "characters")

    @property
    def writable(self) -> bool:
        """Whether any action can be allowed at all (a token or an auth callable exists)."""
        return bool(self.tokens) or self.auth is not None


def host_patterns(names: Any) -> tuple[str, ...]:
    """``names`` checked as ``Host`` patterns, lower-cased (browsers send any case).

    >>> host_patterns(["Ops.Example.com", "[::1]", "*.example.org"])
    ('ops.example.com', '[::1]', '*.example.org')
    >>> host_patterns(["ops.example.com:8642"])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: allowed_hosts: 'ops.example.com:8642' is not a host name ...
    """
    if isinstance(names, (str, bytes)) or not isinstance(names, Iterable):
        raise ValueError("allowed_hosts must be a list of host names (['*'] for any)")
    patterns = tuple(names)
    if not patterns:
        raise ValueError("allowed_hosts is empty: no request could be answered (['*'] for any)")
    for name in patterns:
        if not isinstance(name, str) or not _HOST_PATTERN.fullmatch(name):
            raise ValueError(f"allowed_hosts: {name!r} is not a host name (no port, scheme "
                             "or path; IPv6 in brackets), '*.domain' or '*'")
    return tuple(name.lower() for name in patterns)


def read_tokens(path: str | None = None, *, environ: Mapping[str, str] | None = None,
                ) -> dict[str, str]:
    """Tokens from a file of ``name:token`` lines (``#`` comments) and ``$OJS_WEB_TOKEN``.

    >>> read_tokens(environ={"OJS_WEB_TOKEN": "x" * 20})
    {'operator': 'xxxxxxxxxxxxxxxxxxxx'}
    """
    environ = os.environ if environ is None else environ
    found: dict[str, str] = {}
    if path:
        with open(path, encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                name, sep, token = line.partition(":")
                if not sep or not name.strip() or not token.strip():
                    raise ValueError(f"{path}:{number}: expected 'name:token'")
                found[name.strip()] = token.strip()
    if environ.get(TOKEN_ENV):
        found.setdefault("operator", environ[TOKEN_ENV])
    return found
