"""``ojs-retry conformance``: run the suite against a framework and broker, print the matrix.

Registered with the ``ojs-retry`` command through the ``ojs_adapters.cli``
entry-point group, so the core never imports a framework.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from conformance import report
from conformance.drivers import DRIVERS, get_driver
from conformance.runner import run_suite


@click.command("conformance")
@click.option("--framework", "frameworks", multiple=True,
              type=click.Choice([*sorted(DRIVERS), "all"]), default=("all",), show_default=True,
              help="Framework to test; repeat or say 'all'.")
@click.option("--broker", "brokers", multiple=True, default=("memory",), show_default=True,
              help="Broker URL (redis://..., amqp://...) or 'memory'; repeatable.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              default=Path("conformance-report"), show_default=True,
              help="Folder for matrix.json and matrix.md.")
@click.option("--timeout", type=float, default=90.0, show_default=True,
              help="Seconds to wait for one framework/broker cell.")
def command(frameworks: tuple[str, ...], brokers: tuple[str, ...], out: Path,
            timeout: float) -> None:
    """Run the OJS retry conformance scenarios and print a requirement matrix.

    \b
    Example:
      ojs-retry conformance --framework dramatiq --broker redis://127.0.0.1:6379/0
      ojs-retry conformance --framework all --broker memory --broker amqp://guest:guest@127.0.0.1//
    """
    names = sorted(DRIVERS) if "all" in frameworks else sorted(set(frameworks))
    cells = []
    for framework in names:
        for broker in brokers:
            click.echo(f"running {framework} on {report.broker_label(broker)} ...", err=True)
            results = run_suite(get_driver(framework), broker, timeout=timeout)
            cells.append(report.cell(framework, broker, results))
    report.print_matrix(cells)
    as_json, as_md = report.write(cells, out)
    click.echo(f"wrote {as_json} and {as_md}", err=True)
    sys.exit(1 if any(c["failed"] for c in cells) else 0)
