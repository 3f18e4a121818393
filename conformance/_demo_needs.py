"""What ``ojs-retry demo`` needs installed per framework and broker, and the extra that has it.

The demo shows both frameworks; a setup with one framework's extra (as the README's
install table recommends) shows that one and names the extra that adds the other,
instead of failing on an import deep inside a driver.
"""

from __future__ import annotations

from importlib.util import find_spec

import click

from conformance.drivers import url_kind

#: Per framework: the modules it imports on each broker kind.
_MODULES = {
    "celery": {"memory": ("celery",), "redis": ("celery", "redis"), "amqp": ("celery",)},
    "dramatiq": {"memory": ("dramatiq",), "redis": ("dramatiq", "redis"),
                 "amqp": ("dramatiq", "pika")},
}
#: The extra (pyproject.toml) that installs them.
_EXTRAS = {"memory": "{}", "redis": "{}-redis", "amqp": "{}-rabbitmq"}


def broker_kind(url: str) -> str:
    """``memory``, ``redis`` or ``amqp``; a ``click.BadParameter`` names the choices."""
    kind = url_kind(url)
    if kind is None:
        raise click.BadParameter(f"{url!r}: give 'memory', a redis://... or an amqp://... "
                                 "URL", param_hint="'--broker'")
    return kind


def missing_extra(framework: str, kind: str) -> str | None:
    """The extra to install for ``framework`` on ``kind``; ``None`` if all is installed."""
    if all(find_spec(module) is not None for module in _MODULES[framework][kind]):
        return None
    return _EXTRAS[kind].format(framework)


def runnable(kind: str) -> tuple[list[str], list[str]]:
    """The frameworks the demo can run on ``kind``, and a sentence for each it cannot."""
    ready, notes = [], []
    for framework in sorted(_MODULES):
        extra = missing_extra(framework, kind)
        if extra is None:
            ready.append(framework)
        else:
            notes.append(f"Not shown: {framework.capitalize()} (pip install "
                         f"'ojs-adapters[{extra}]' adds it).")
    if not ready:
        extras = ",".join(_EXTRAS[kind].format(name) for name in sorted(_MODULES))
        raise click.ClickException("the demo needs Celery or Dramatiq: "
                                   f"pip install 'ojs-adapters[{extras}]'")
    return ready, notes
