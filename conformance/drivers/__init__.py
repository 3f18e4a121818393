"""Framework drivers, imported only when asked for (each pulls in its framework).

This package itself imports no framework: ``url_kind``, which reads what kind of broker a
``--broker`` URL names, serves the demo's check of what is installed as well as each driver.

>>> url_kind("memory"), url_kind("rediss://h:6380/0"), url_kind("amqps://h//"), url_kind("sqs://q")
('memory', 'redis', 'amqp', None)
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Literal

from conformance.driver import Driver

#: Framework name -> module and class of its driver.
DRIVERS: dict[str, tuple[str, str]] = {
    "celery": ("conformance.drivers.celery_driver", "CeleryDriver"),
    "dramatiq": ("conformance.drivers.dramatiq_driver", "DramatiqDriver"),
}
#: What ``--broker`` may say for the embedded default of each framework.
MEMORY_ALIASES = frozenset({"memory", "memory://", "stub", "stub://"})

#: A kind of broker: the embedded default, Redis or RabbitMQ (each driver names its own).
UrlKind = Literal["memory", "redis", "amqp"]
#: The kinds of broker by URL scheme that every reader takes; a driver may add spellings.
SCHEMES: Mapping[str, UrlKind] = {"redis": "redis", "rediss": "redis", "amqp": "amqp",
                                  "amqps": "amqp"}


def url_kind(url: str, schemes: Mapping[str, UrlKind] = SCHEMES) -> UrlKind | None:
    """``memory`` for a ``MEMORY_ALIASES`` name, else the kind ``schemes`` gives the URL's
    scheme (the text before ``://``); ``None`` for anything else, which the caller refuses
    in its own words."""
    if url in MEMORY_ALIASES:
        return "memory"
    scheme, separator, _ = url.partition("://")
    return schemes.get(scheme) if separator else None


def get_driver(framework: str) -> type[Driver]:
    """The driver class for ``framework``; ``ValueError`` names the choices."""
    try:
        module, name = DRIVERS[framework]
    except KeyError:
        raise ValueError(f"unknown framework {framework!r}; choose from {sorted(DRIVERS)}") \
            from None
    driver: type[Driver] = getattr(importlib.import_module(module), name)
    return driver
