"""Framework drivers, imported only when asked for (each pulls in its framework)."""

from __future__ import annotations

import importlib

from conformance.driver import Driver

#: Framework name -> module and class of its driver.
DRIVERS: dict[str, tuple[str, str]] = {
    "celery": ("conformance.drivers.celery_driver", "CeleryDriver"),
    "dramatiq": ("conformance.drivers.dramatiq_driver", "DramatiqDriver"),
}
#: What ``--broker`` may say for the embedded default of each framework.
MEMORY_ALIASES = frozenset({"memory", "memory://", "stub", "stub://"})


def get_driver(framework: str) -> type[Driver]:
    """The driver class for ``framework``; ``ValueError`` names the choices."""
    try:
        module, name = DRIVERS[framework]
    except KeyError:
        raise ValueError(f"unknown framework {framework!r}; choose from {sorted(DRIVERS)}") \
            from None
    driver: type[Driver] = getattr(importlib.import_module(module), name)
    return driver
