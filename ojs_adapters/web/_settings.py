"""What an operator configures for the console: where the jobs are, and who may act.

>>> ConsoleSettings(framework="celery", broker="redis://127.0.0.1:6379/0").writable
False
>>> ConsoleSettings(framework="celery", tokens={"alice": "s3cret-token-of-alice"}).writable
True
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: An auth callable a host application supplies: the request (Starlette's) in, the
#: operator's name out, or ``None`` for "no write access".
AuthCallable = Callable[[Any], "str | None"]
#: Environment variable holding one operator token (named ``operator``).
TOKEN_ENV = "OJS_WEB_TOKEN"
#: Shortest token accepted: a guessable token is no protection.
MIN_TOKEN_CHARS = 16


@dataclass(frozen=True)
class ConsoleSettings:
    """The console's configuration.

    ``framework`` (``celery``/``dramatiq``) with ``app`` (``module:attr``) or ``broker``
    (a URL), ``queues`` and ``options`` as ``ojs-retry dlq`` takes them. The console is
    read-only unless ``tokens`` (``{name: token}``) or ``auth`` (a host application's
    callable) is given. ``show_args`` shows job arguments on dead letters (off: they
    may hold personal data). ``stats_url``/``stats_prefix``: where the workers'
    ``enable_stats`` writes (default: the broker's or result backend's Redis).
    ``secret`` signs sessions and CSRF tokens (random per process by default).
    ``allowed_hosts``: the ``Host`` names it answers (``*.example.com`` for a domain's
    hosts; ``*`` any, for an app that checks hosts itself); others get a 400, so a page
    that rebinds its DNS name to the console's address cannot read it.
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
        if isinstance(self.allowed_hosts, str) or not self.allowed_hosts:
            raise ValueError("allowed_hosts must be a list of host names (['*'] for any)")
        for pattern in self.allowed_hosts:
            if "*" in pattern[1:] or (pattern.startswith("*") and pattern != "*"
                                      and not pattern.startswith("*.")):
                raise ValueError(f"allowed_hosts: {pattern!r} is not a host name, "
                                 "'*.domain' or '*'")
        for name, token in self.tokens.items():
            if len(token) < MIN_TOKEN_CHARS:
                raise ValueError(f"the token of {name!r} is shorter than {MIN_TOKEN_CHARS} "
                                 "characters")

    @property
    def writable(self) -> bool:
        """Whether any action can be allowed at all (a token or an auth callable exists)."""
        return bool(self.tokens) or self.auth is not None


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
