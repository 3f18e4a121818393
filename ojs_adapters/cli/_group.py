"""The ``ojs-retry`` click group, open to verbs from other packages.

Other distributions (the conformance suite, the Celery and Dramatiq adapters)
add verbs by declaring an entry point in the group ``ojs_adapters.cli`` whose
object is a ``click.Command``::

    [project.entry-points."ojs_adapters.cli"]
    conformance = "conformance.cli:command"

The core never imports them: ``ojs-retry --help`` lists plugin verbs from the
entry-point metadata alone, and a plugin is imported only when its verb runs.
Built-in verbs win over a plugin of the same name.
"""

from __future__ import annotations

import re
from importlib.metadata import EntryPoint, entry_points

import click

#: The entry-point group plugins register their ``click.Command`` under.
ENTRY_POINT_GROUP = "ojs_adapters.cli"


def plugin_entry_points() -> dict[str, EntryPoint]:
    """The plugin verbs installed now, by name (metadata only; nothing is imported)."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


class PluginGroup(click.Group):
    """A ``click.Group`` that also offers the verbs registered under ``ENTRY_POINT_GROUP``."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(plugin_entry_points()))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        builtin = super().get_command(ctx, cmd_name)
        if builtin is not None:
            return builtin
        entry = plugin_entry_points().get(cmd_name)
        return None if entry is None else _load(entry)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, command.get_short_help_str(limit=70))
                for name, command in sorted(self.commands.items()) if not command.hidden]
        plugins = plugin_entry_points()
        rows += [(name, f"(plugin from {_distribution(ep)}; run it for its help)")
                 for name, ep in sorted(plugins.items()) if name not in self.commands]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _load(entry: EntryPoint) -> click.Command:
    """The plugin's command, or a stand-in that reports why it could not be loaded."""
    try:
        command = entry.load()
    except ModuleNotFoundError as exc:  # a verb of an extra that is not installed
        missing = exc.name or ""
        if not missing or missing.split(".")[0] == re.split(r"[.:]", entry.value)[0]:
            return _broken(entry, f"{type(exc).__name__}: {exc}")  # its own module: broken
        return _broken(entry, _not_installed(entry, missing))
    except Exception as exc:  # a broken plugin must not break the core verbs
        return _broken(entry, f"{type(exc).__name__}: {exc}")
    if not isinstance(command, click.Command):
        return _broken(entry, f"{entry.value} is not a click.Command")
    return command


def _not_installed(entry: EntryPoint, module: str) -> str:
    """Why a verb cannot load: the module it needs, and the extra of its distribution
    that installs it when the distribution's metadata names one."""
    dist = getattr(entry, "dist", None)
    top = module.split(".", 1)[0]
    wanted = top.replace("_", "-").lower()
    extras = []
    for line in getattr(dist, "requires", None) or ():
        name, _, marker = line.partition(";")
        extra = re.search(r"extra\s*==\s*[\"']([^\"']+)[\"']", marker)
        if extra and extra.group(1) != "dev" and \
                re.split(r"[\s\[<>=!~;]", name.strip(), maxsplit=1)[0].lower() == wanted:
            extras.append(extra.group(1))
    if not extras:
        return f"it needs {top}, which is not installed"
    chosen = entry.name if entry.name in extras else extras[0]  # the verb's own extra first
    return f"it needs {top}, which is not installed: pip install " \
        f"'{_distribution(entry)}[{chosen}]'"


def _broken(entry: EntryPoint, why: str) -> click.Command:
    def report() -> None:
        raise click.ClickException(f"{entry.name!r} cannot run here: {why}")

    return click.Command(entry.name, callback=report, help=f"Cannot run here: {why}.")


def _distribution(entry: EntryPoint) -> str:
    dist = getattr(entry, "dist", None)
    return str(getattr(dist, "name", None) or entry.value.split(":", 1)[0])
