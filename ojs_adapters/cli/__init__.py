"""``ojs-retry``: everyday work with OJS retry policies from the command line.

Verbs: ``validate``, ``schedule``, ``migrate`` and ``explain``. Every verb reads
JSON or YAML from a file or ``-`` (stdin), has ``--json``, and reports bad
input as the OJS error (code, field, rule) with exit status 1. ``dlq`` manages
dead letters (``ojs_adapters.cli._dlq_cmd``).

Other packages add verbs through the entry-point group ``ojs_adapters.cli``
(see ``ojs_adapters.cli._group``); the core never imports them, nor Celery,
Dramatiq or kombu.

>>> from click.testing import CliRunner
>>> CliRunner().invoke(main, ["validate", "-"], input='{"max_attempts": 2}').exit_code
0
"""

from __future__ import annotations

import click

from ojs_adapters.cli._dlq_cmd import dlq
from ojs_adapters.cli._group import ENTRY_POINT_GROUP, PluginGroup, plugin_entry_points
from ojs_adapters.cli._migrate_cmd import migrate
from ojs_adapters.cli._policy_cmds import explain, schedule, validate


@click.group(cls=PluginGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ojs-adapters", prog_name="ojs-retry")
def main() -> None:
    """Validate, inspect, explain and migrate OJS retry policies.

    \b
    Examples:
      ojs-retry validate policy.json
      ojs-retry schedule policy.yaml --plot delays.png
      ojs-retry explain policy.json --error payment.card_stolen --attempt 2
      ojs-retry migrate --from sidekiq app/jobs/
      ojs-retry dlq list --framework dramatiq --broker redis://localhost:6379/0

    Exit status: 0 ok, 1 invalid input (the OJS error is printed), 2 bad usage,
    3 a migrated job has no OJS equivalent, or a lossy one (see --allow-lossy),
    70 a bug in ojs-retry.
    Packages add verbs through the
    entry-point group "ojs_adapters.cli".
    """


for _command in (validate, schedule, explain, migrate, dlq):
    main.add_command(_command)

__all__ = ["ENTRY_POINT_GROUP", "PluginGroup", "main", "plugin_entry_points"]
