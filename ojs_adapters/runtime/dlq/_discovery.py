"""Finding dead-letter queues on a broker that cannot list them, and saying where one looked.

AMQP 0-9-1 has no verb that lists queues. On RabbitMQ the adapters ask the
management plugin's HTTP API (``GET /api/queues/<vhost>``, standard library only)
when it answers, and otherwise look in the queues they know of: the app's, the
broker's declared ones, ``--queue``, and the default queue of a default setup.
``Coverage`` says which dead-letter queues were looked in and whether that was
every one the broker has, so no caller reports "0 dead letters" from a partial look.

>>> originals(["orders.XQ", "orders", "XQ", "mail.XQ"], ["{queue}.XQ"])
{'orders.XQ': 'orders', 'mail.XQ': 'mail'}
>>> Coverage(("default.XQ",), False, "RabbitMQ cannot list queues").describe()
'looked in: default.XQ (RabbitMQ cannot list queues)'
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from dataclasses import dataclass
from http.client import HTTPException
from typing import Any, NamedTuple
from urllib.error import HTTPError
from urllib.parse import quote, unquote, urlsplit
from urllib.request import ProxyHandler, Request, build_opener

#: Seconds to wait for the RabbitMQ management API before looking in known queues only.
MANAGEMENT_TIMEOUT = 2.0
#: Value of the ``management`` option that turns the management API off.
MANAGEMENT_OFF = "none"


@dataclass(frozen=True)
class Coverage:
    """The dead-letter queues a store looked in, and whether they are all the broker has.

    ``source`` says how the names were found (or why the look may be partial).
    """

    looked_in: tuple[str, ...]
    complete: bool
    source: str

    def describe(self) -> str:
        """One line for a person: where it looked and how it knew."""
        return f"looked in: {', '.join(self.looked_in) or 'no queue'} ({self.source})"

    def to_dict(self) -> dict[str, Any]:
        return {"complete": self.complete, "looked_in": list(self.looked_in),
                "source": self.source}


class AmqpAddress(NamedTuple):
    """Where an AMQP broker is and who logs in: what the management API needs too."""

    host: str
    vhost: str
    username: str
    password: str
    tls: bool = False


class QueueListing(NamedTuple):
    """Every queue name of a vhost (``None`` when the API did not answer) and what was asked."""

    names: tuple[str, ...] | None
    source: str


def management_url(address: AmqpAddress) -> str:
    """The management API a default RabbitMQ serves beside ``address`` (same host)."""
    host = f"[{address.host}]" if ":" in address.host else address.host
    return f"https://{host}:15671" if address.tls else f"http://{host}:15672"


def list_queues(address: AmqpAddress, *, url: str | None = None,
                timeout: float = MANAGEMENT_TIMEOUT) -> QueueListing:
    """Every queue of ``address``'s vhost, read from the RabbitMQ management API.

    ``url`` is the API's base URL (default: ``management_url``); credentials in it
    win over the AMQP ones. Proxies are not used: the API sits beside the broker.
    Any failure (plugin off, refused, 401 for a user without the ``management``
    tag) gives ``names=None`` and the reason in ``source``.
    """
    parts = urlsplit(url or management_url(address))
    user = unquote(parts.username) if parts.username else address.username
    password = unquote(parts.password or "") if parts.username else address.password
    base = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path.rstrip('/')}"
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    request = Request(f"{base}/api/queues/{quote(address.vhost, safe='')}?columns=name",
                      headers={"Authorization": f"Basic {token}"})
    try:
        with build_opener(ProxyHandler({})).open(request, timeout=timeout) as answer:
            data = json.load(answer)
    except HTTPError as exc:
        hint = " (the AMQP user needs the 'management' tag)" if exc.code == 401 else ""
        return QueueListing(None, f"the management API at {base} answered HTTP {exc.code} "
                                  f"{exc.reason}{hint}")
    except (OSError, HTTPException, ValueError) as exc:
        return QueueListing(None, f"the management API at {base} did not answer: "
                                  f"{getattr(exc, 'reason', None) or exc}")
    if not isinstance(data, list):
        return QueueListing(None, f"the management API at {base} gave no queue list")
    names = tuple(q["name"] for q in data if isinstance(q, dict) and isinstance(q.get("name"), str))
    return QueueListing(names, f"every queue of vhost {address.vhost!r}, listed by the "
                               f"management API at {base}")


def originals(names: Iterable[str], templates: Iterable[str]) -> dict[str, str]:
    """``{dead-letter queue: original queue}`` for the ``names`` that fit a template.

    A template names a dead-letter queue with ``{queue}`` for the original's name
    (``"{queue}.XQ"``, ``"{queue}.dead_letter"``, ``"dlq.{queue}"``).
    """
    shapes = [t.partition("{queue}")[::2] for t in templates if "{queue}" in t]
    found: dict[str, str] = {}
    for name in names:
        for prefix, suffix in shapes:
            core = name[len(prefix):len(name) - len(suffix)]
            if core and name.startswith(prefix) and name.endswith(suffix):
                found[name] = core
                break
    return found


def glob_for(template: str) -> str:
    """A Redis ``SCAN MATCH`` pattern for every name ``template`` can give.

    >>> glob_for("dlq[{queue}]")
    'dlq\\\\[*\\\\]'
    """
    prefix, _, suffix = template.partition("{queue}")
    return f"{_escape(prefix)}*{_escape(suffix)}"


def _escape(text: str) -> str:
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)
