"""``ojs-retry web``: serve the console (registered through the ``ojs_adapters.cli`` group)."""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from ojs_adapters.web._settings import ConsoleSettings

#: Default port of ``ojs-retry web``.
DEFAULT_PORT = 8642
#: The Host names of this machine: always answered (a rebinding page never sends them).
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


def is_loopback(bind: str) -> bool:
    """Whether binding ``bind`` keeps the console on this machine."""
    try:
        return ipaddress.ip_address(bind.strip("[]")).is_loopback
    except ValueError:
        return bind.lower() == "localhost"


def allowed_hosts(bind: str, given: tuple[str, ...]) -> tuple[str, ...]:
    """The ``Host`` names the console answers: the loopback names and the bind address,
    with those given; any when bound beyond loopback with none given.

    >>> allowed_hosts("127.0.0.2", ())
    ('127.0.0.1', 'localhost', '[::1]', '127.0.0.2')
    >>> allowed_hosts("0.0.0.0", ()), allowed_hosts("0.0.0.0", ("ops.example.com",))
    (('*',), ('127.0.0.1', 'localhost', '[::1]', 'ops.example.com'))
    """
    if not given and not is_loopback(bind):
        return ("*",)
    own = () if not is_loopback(bind) else (f"[{bind}]" if ":" in bind else bind,)
    names = [*LOOPBACK_NAMES, *own, *given]
    return tuple(dict.fromkeys(name.lower() for name in names))


def _hosts_option(_ctx: click.Context, _param: click.Parameter,
                  value: tuple[str, ...]) -> tuple[str, ...]:
    from ojs_adapters.web._settings import host_patterns

    try:
        return host_patterns(value) if value else ()
    except ValueError as exc:
        raise click.BadParameter(str(exc).replace("allowed_hosts: ", "")) from None


@click.command("web")
@click.option("--framework", required=True, type=click.Choice(["celery", "dramatiq"]))
@click.option("--app", metavar="MODULE[:ATTR]",
              help="The Celery app or Dramatiq broker, imported from the current directory.")
@click.option("--broker", metavar="URL", help="Broker URL, instead of --app.")
@click.option("--queue", "queues", multiple=True, help="A queue to look at beyond those found.")
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE",
              help="As for 'ojs-retry dlq' (namespace=, records=, backend=, management=).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind; anything but loopback exposes the console.")
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=int)
@click.option("--allowed-host", "hosts", multiple=True, metavar="NAME",
              callback=_hosts_option,
              help="A Host name the console answers besides the loopback names (a reverse "
                   "proxy's; '*.example.com' a domain's). Bound beyond loopback without "
                   "one, any name is answered.")
@click.option("--token-file", type=click.Path(exists=True, dir_okay=False),
              help="Operator tokens, one 'name:token' per line (also $OJS_WEB_TOKEN). "
                   "Without one the console is read-only.")
@click.option("--show-args", is_flag=True, help="Show job arguments on dead letters.")
@click.option("--stats", "stats_url", metavar="REDIS_URL",
              help="Where the workers' enable_stats() writes. Without it: a Redis "
                   "broker; else the Redis of the workers' RedisRecordStore (Dramatiq "
                   "--app, or --option records=URL); else the result backend's Redis.")
@click.option("--stats-prefix", default="ojs-stats", show_default=True)
def command(framework: str, app: str | None, broker: str | None, queues: tuple[str, ...],
            options: tuple[str, ...], host: str, port: int, hosts: tuple[str, ...],
            token_file: str | None, show_args: bool, stats_url: str | None,
            stats_prefix: str) -> None:
    """Serve the operator console: waiting retries, dead letters, decisions.

    \b
    Examples:
      ojs-retry web --framework celery --app myapp:app
      OJS_WEB_TOKEN=... ojs-retry web --framework dramatiq --broker redis://localhost:6379/0
    """
    try:
        import uvicorn

        from ojs_adapters.web import ConsoleSettings, create_app, read_tokens
    except ImportError as exc:
        raise click.ClickException(f"the console needs its extra: pip install "
                                   f"'ojs-adapters[web]' ({exc})") from None
    if not app and not broker:
        raise click.UsageError("give --app MODULE[:ATTR] or --broker URL")
    from ojs_adapters.runtime.dlq import OriginalQueueWanted, read_options

    try:
        settings_options = read_options(framework, options)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--option'") from None
    try:
        tokens = read_tokens(token_file)
        settings = ConsoleSettings(
            framework=framework, app=app, broker=broker, queues=queues,
            options=settings_options, tokens=tokens,
            show_args=show_args, stats_url=stats_url, stats_prefix=stats_prefix,
            allowed_hosts=allowed_hosts(host, hosts))
    except OriginalQueueWanted as exc:  # as 'ojs-retry dlq' says it
        raise click.BadParameter(exc.pass_instead(), param_hint="'--queue'") from None
    except (OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    if queues:
        _refuse_dead_letter_queues(settings)
    from ojs_adapters.web._logs import console_logging

    console_logging()  # the project's INFO lines, not pika's or kombu's
    mode = "read-write for " + ", ".join(sorted(tokens)) if tokens else "read-only"
    where = f"[{host}]" if ":" in host else host
    click.echo(f"ojs console ({framework}, {mode}) on http://{where}:{port}/", err=True)
    if not is_loopback(host):
        click.echo(f"warning: bound to {host}: reachable beyond this machine", err=True)
        if not hosts:
            click.echo("warning: any Host name is answered: give --allowed-host NAME",
                       err=True)
    uvicorn.run(create_app(settings), host=host, port=port, log_level="warning",
                access_log=False)


def _refuse_dead_letter_queues(settings: ConsoleSettings) -> None:
    """Exit 2, as ``ojs-retry dlq`` does, when a ``--queue`` is a dead-letter queue: only the
    adapter knows its names (Celery's from the app's settings), and it says so before
    reaching the broker. Anything else the open meets, the console's pages say."""
    from ojs_adapters.runtime.dlq import OriginalQueueWanted, open_dead_letter_queue

    try:
        opened = open_dead_letter_queue(settings.framework, app=settings.app,
                                        broker=settings.broker, queues=settings.queues,
                                        options=settings.options)
    except OriginalQueueWanted as exc:
        raise click.BadParameter(exc.pass_instead(), param_hint="'--queue'") from None
    except Exception:  # the broker or the app: the console's pages say it, not startup
        return
    opened.close()
