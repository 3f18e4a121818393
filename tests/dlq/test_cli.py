"""``ojs-retry dlq`` through click's CliRunner, on Dramatiq dead letters (issue 7)."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import dramatiq
import pytest
from click.testing import CliRunner, Result

from dramatiq_ext import MemoryRecordStore, OjsRetries
from ojs_adapters import JobError
from ojs_adapters.cli import main
from ojs_adapters.runtime.dlq import DeadLetter, DeadLetters
from ojs_adapters.runtime.dlq.memory import MemoryDeadLetterStore
from tests.dlq.scenario import wait_for
from tests.dlq.test_dramatiq_dlq import POLICY, quiet
from tests.dramatiq_ext.harness import Env, make_env, pika_url

#: The broker ``--app tests.dlq.test_cli:BROKER`` names while a test runs.
BROKER: Any = None


class Setup:
    """Six dead jobs on one queue, a worker running, and the CLI options that reach them."""

    amqp_url: str

    def __init__(self, env: Env, connection: list[str]) -> None:
        self.env = env
        self.connection = connection
        self.healed = threading.Event()
        self.done: list[int] = []

        def job(n: int) -> None:
            if not self.healed.is_set():
                raise JobError("billing.Declined" if n < 2 else "net.Timeout", f"job {n}")
            self.done.append(n)

        self.actor = dramatiq.actor(broker=env.broker, queue_name=env.queue,
                                    actor_name=f"cli_{env.queue}", retry_policy=POLICY)(job)

    def run(self, verb: str, *args: str, input: str | None = None) -> Result:
        return CliRunner().invoke(main, ["dlq", verb, *args, *self.connection], input=input)

    def json(self, verb: str, *args: str) -> Any:
        result = self.run(verb, *args, "--json")
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)  # stderr may carry a note on where it looked


@pytest.fixture(params=["stub", "redis", "rabbitmq"])
def setup(request: pytest.FixtureRequest) -> Iterator[Setup]:
    global BROKER
    kind = request.param
    urls: dict[str, str] = {}
    if kind != "stub":
        urls["redis_url"] = request.getfixturevalue("redis_url")
    if kind == "rabbitmq":
        urls["amqp_url"] = request.getfixturevalue("amqp_url")
    ojs = OjsRetries(store=MemoryRecordStore()) if kind == "stub" else None
    with quiet(), make_env(kind, ojs=ojs, **urls) as env:  # type: ignore[arg-type]
        connection = ["--framework", "dramatiq"]
        if kind == "redis":
            connection += ["--broker", urls["redis_url"], "--option", f"namespace={env.namespace}"]
        else:  # RabbitMQ: the workers' records are in their Results backend, reached by --app
            BROKER = env.broker
            connection += ["--app", "tests.dlq.test_cli:BROKER"]
        made = Setup(env, connection)
        made.amqp_url = pika_url(urls["amqp_url"]) if kind == "rabbitmq" else ""
        for n in range(6):
            made.actor.send(n)
        env.start()
        wait_for(lambda: _dead(env) == 6, "six dead letters")
        yield made
        BROKER = None


def _dead(env: Env) -> int:
    if env.kind == "stub":
        return len(env.broker.dead_letters_by_queue[env.queue])
    if env.kind == "redis":
        return int(env.redis.zcard(f"{env.namespace}:{env.queue}.XQ"))
    channel = env.broker.channel
    return int(channel.queue_declare(f"{env.queue}.XQ", passive=True).method.message_count)


@pytest.mark.broker
def test_dlq_verbs_list_show_replay_delete_prune_purge(setup: Setup) -> None:
    listed = setup.json("list")
    assert listed["total"] == 6 and "payload" not in listed["items"][0]
    ids = [x["id"] for x in listed["items"]]
    assert setup.json("list", "--error-type", "billing.*")["total"] == 2
    assert setup.json("list", "--task-type", "nope*")["total"] == 0
    assert setup.json("list", "--since", "P1D")["total"] == 6
    assert setup.json("list", "--until", "2020-01-01T00:00:00Z")["total"] == 0
    second = setup.json("list", "--page", "2", "--per-page", "4")
    assert [x["id"] for x in second["items"]] == ids[4:] and second["pages"] == 2
    table = setup.run("list")
    assert table.exit_code == 0 and "6 dead letters" in table.output and ids[0] in table.output
    assert "…" not in table.output  # a narrow column folds its text, never cuts it

    shown = setup.json("show", ids[0])
    assert shown["history"][0]["attempt"] == 1 and shown["payload"]["args"] == [
        int(shown["history"][0]["message"].split()[-1])]
    text = setup.run("show", ids[0])
    assert text.exit_code == 0 and "history:" in text.output and "HANDLER_ERROR" in text.output
    missing = setup.run("show", "no-such-job")
    assert missing.exit_code == 1 and "no dead letter" in missing.output

    if setup.amqp_url:  # a bare RabbitMQ URL lists, but cannot replay: no records in reach
        bare = ["dlq", "list", "--framework", "dramatiq", "--broker", setup.amqp_url, "--queue",
                setup.env.queue, "--json"]
        assert json.loads(CliRunner().invoke(main, bare).stdout)["total"] == 6
        bare[1] = "replay"
        refused = CliRunner().invoke(main, [*bare[:2], ids[0], *bare[2:]])
        assert refused.exit_code == 1 and "needs the workers' job records" in refused.output
        assert setup.json("list")["total"] == 6  # nothing moved

    usage = setup.run("replay")
    assert usage.exit_code == 2 and "give job ids, a filter, or --all" in usage.output
    setup.healed.set()
    replayed = setup.json("replay", ids[0], ids[1])
    assert replayed == {"replayed": ids[:2], "skipped": []}
    again = setup.run("replay", ids[0], "--json")  # no longer dead: said, and exit 1
    assert again.exit_code == 1 and json.loads(again.stdout)["skipped"] == [ids[0]]
    typo = setup.run("replay", "no-such-job")
    assert typo.exit_code == 1
    assert "not (or no longer) dead letters here: no-such-job" in typo.stderr
    typo = setup.run("delete", "no-such-job")
    assert typo.exit_code == 1 and "not (or no longer) dead letters here: no-such-job" \
        in typo.output  # the id that named nothing, not just "deleted 0"
    wait_for(lambda: len(setup.done) == 2, "the two replayed jobs to succeed")

    both = setup.run("delete", ids[2], "no-such-job")  # one deleted, one a typo: named
    assert both.exit_code == 0 and "deleted 1" in both.output
    assert "not (or no longer) dead letters here: no-such-job" in both.output
    assert ids[2] not in both.output.split("here:")[1]
    elsewhere = setup.run("delete", ids[3], "--queue", "some-other-queue")  # not selected
    assert elsewhere.exit_code == 1 and f"dead letters here: {ids[3]}" in elsewhere.output
    assert setup.run("delete").exit_code == 2
    assert setup.json("prune", "--max-age", "none", "--max-count", "2") == {"pruned": 1}
    assert setup.json("prune") == {"pruned": 0}
    aborted = setup.run("purge", input="n\n")
    assert aborted.exit_code == 1 and setup.json("list")["total"] == 2
    assert setup.json("purge", "--yes") == {"purged": 2}
    assert setup.json("list")["total"] == 0 and _dead(setup.env) == 0
    assert sorted(setup.done) == sorted(
        int(x["history"][0]["message"].split()[-1]) for x in listed["items"][:2])


class _Counted(MemoryDeadLetterStore):
    """Dead letters in memory that count how often all of them were read (one per selection)."""

    scans = 0

    def scan(self, queue: str | None = None) -> list[DeadLetter]:
        self.scans += 1
        return super().scan(queue)


def _in_memory(monkeypatch: pytest.MonkeyPatch, ids: list[str], *, task_type: str = "t",
               error_type: str = "E") -> _Counted:
    """What the CLI opens, whatever ``--framework`` says: these dead letters, in memory."""
    store = _Counted()
    for job_id in ids:
        store.add(DeadLetter(id=job_id, queue="q", task_type=task_type, error_type=error_type,
                             dead_lettered_at=datetime.now(timezone.utc), attempt=1))
    monkeypatch.setattr("ojs_adapters.cli._dlq_cmd.open_dead_letter_queue",
                        lambda *_args, **_kwargs: DeadLetters(store))
    return store


def test_dlq_delete_selects_once_and_names_the_ids_its_report_skipped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The ids that named nothing come from the delete's own report, as replay's do: one
    selection, not a listing first (which read every queue a second time)."""
    store = _in_memory(monkeypatch, ["job-0", "job-1", "job-2"])
    runner = CliRunner()
    result = runner.invoke(main, ["dlq", "delete", "job-0", "typo", "job-2", "--framework",
                                  "memory", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"deleted": ["job-0", "job-2"], "skipped": ["typo"]}
    assert "not (or no longer) dead letters here: typo" in result.stderr
    assert store.scans == 1
    again = runner.invoke(main, ["dlq", "delete", "job-0", "--framework", "memory"])
    assert again.exit_code == 1 and again.stdout == "deleted 0\n"
    assert "not (or no longer) dead letters here: job-0" in again.stderr


def test_dlq_list_piped_takes_its_width_from_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Piped (no terminal), the table is as wide as ``COLUMNS`` says, wider or narrower than
    the 120 columns it takes when nothing says."""
    long = "billing.invoices.monthly." * 6
    _in_memory(monkeypatch, ["job-" + "0" * 36], task_type=long, error_type=long)

    def widest(columns: str | None) -> int:
        result = CliRunner().invoke(main, ["dlq", "list", "--framework", "memory"],
                                    env={"COLUMNS": columns})
        assert result.exit_code == 0, result.output
        assert "1 dead letter" in result.stdout
        return max(len(line) for line in result.stdout.splitlines())

    assert widest(None) == 120
    assert widest("200") == 200
    assert widest("90") == 90


def test_dlq_reports_bad_connections_without_a_traceback() -> None:
    runner = CliRunner()
    unknown = runner.invoke(main, ["dlq", "list", "--framework", "resque"])
    assert unknown.exit_code == 1 and "no dead-letter backend for 'resque'" in unknown.output
    nothing = runner.invoke(main, ["dlq", "list", "--framework", "dramatiq"])
    assert nothing.exit_code == 1 and "--app module[:broker] or --broker URL" in nothing.output
    bad_app = runner.invoke(main, ["dlq", "list", "--framework", "dramatiq", "--app", "json:dumps"])
    assert bad_app.exit_code == 1 and "not a Dramatiq broker" in bad_app.output
    scheme = runner.invoke(main, ["dlq", "list", "--framework", "dramatiq", "--broker", "sqs://x"])
    assert scheme.exit_code == 1 and "unsupported" in scheme.output
    age = runner.invoke(main, ["dlq", "prune", "--framework", "dramatiq", "--broker", "sqs://x",
                               "--max-age", "P1M"])
    assert age.exit_code == 2 and "Traceback" not in age.output  # a bad option value
    assert "Invalid value for '--max-age': 'P1M' is not an ISO 8601 duration" in age.output
    since = runner.invoke(main, ["dlq", "list", "--framework", "dramatiq", "--broker",
                                 "sqs://x", "--since", "yesterday"])
    assert since.exit_code == 2 and "'yesterday' is neither an ISO 8601 time" in since.output
    assert "dlq" in runner.invoke(main, ["--help"]).output


def test_dlq_show_prints_a_job_s_text_as_it_is() -> None:
    """Error text is the job's, not rich markup: ``[/etc/app.conf]`` neither fails ``show``
    nor vanishes from it; ``--json`` turns a value JSON has no type for into its str."""
    global BROKER
    with quiet(), make_env("stub", ojs=OjsRetries(store=MemoryRecordStore())) as env:
        message = "cannot read [/etc/app.conf]: [type=int_parsing] [red]x[/red]"

        def job() -> None:
            raise JobError("config.Missing", message)

        sent = dramatiq.actor(broker=env.broker, queue_name=env.queue,
                              actor_name=f"markup_{env.queue}",
                              retry_policy={"max_attempts": 1,
                                            "on_exhaustion": "dead_letter"})(job).send()
        env.start()
        wait_for(lambda: _dead(env) == 1, "the dead letter")
        BROKER = env.broker
        try:
            shown = CliRunner().invoke(main, ["dlq", "show", sent.message_id, "--framework",
                                              "dramatiq", "--app", "tests.dlq.test_cli:BROKER"])
        finally:
            BROKER = None
    assert shown.exit_code == 0, shown.output
    assert message in shown.output


def test_cli_json_shows_values_json_has_no_type_for_as_text(
        capsys: pytest.CaptureFixture[str]) -> None:
    from datetime import datetime, timezone
    from uuid import UUID

    from ojs_adapters.cli._io import print_json

    print_json({"args": [datetime(2026, 11, 27, tzinfo=timezone.utc), UUID(int=1)]})
    assert json.loads(capsys.readouterr().out) == {
        "args": ["2026-11-27 00:00:00+00:00", "00000000-0000-0000-0000-000000000001"]}


def test_dlq_list_keeps_typical_names_whole_at_the_piped_width(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """At 120 columns a uuid id, a task name and a dotted error type each read on one line
    (the names folded mid-word when seven columns shared what the id and time left)."""
    _in_memory(monkeypatch, ["3f2b8c1e-9a7d-4c2e-8f1a-2b3c4d5e6f70"], task_type="app.refund",
               error_type="builtins.RuntimeError")
    result = CliRunner().invoke(main, ["dlq", "list", "--framework", "memory"])
    assert result.exit_code == 0, result.output
    row = next(line for line in result.stdout.splitlines() if "3f2b8c1e" in line)
    for text in ("3f2b8c1e-9a7d-4c2e-8f1a-2b3c4d5e6f70", "app.refund",
                 "builtins.RuntimeError"):
        assert text in row, result.stdout
    assert datetime.now(timezone.utc).strftime("%Y-%m-%d ") in row  # seconds, UTC


def test_dlq_replay_names_the_ids_it_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    """replay names the ids that named no dead letter on stderr, as delete does (a count
    alone left the user to find the typo), and exits 1 for them."""
    _in_memory(monkeypatch, ["job-0", "job-1"])
    result = CliRunner().invoke(main, ["dlq", "replay", "job-0", "typo", "gone",
                                       "--framework", "memory"])
    assert result.exit_code == 1, result.output
    assert result.stdout == "replayed 1 dead letter; skipped 2\n"
    assert "not (or no longer) dead letters here: gone, typo" in result.stderr


def test_dlq_refuses_an_option_key_the_framework_does_not_read() -> None:
    """An unknown ``--option`` key (``namespace`` is Dramatiq's; a typo) is refused before
    any broker is reached, naming the key and the valid ones; it was silently ignored."""
    runner = CliRunner()
    celery = runner.invoke(main, ["dlq", "list", "--framework", "celery", "--broker",
                                  "redis://127.0.0.1:1/0", "--option", "namespace=x"])
    assert celery.exit_code == 2, celery.output
    assert "Invalid value for '--option': unknown key 'namespace' for celery; valid keys: " \
           "backend, management" in celery.output
    dramatiq_ = runner.invoke(main, ["dlq", "purge", "--yes", "--framework", "dramatiq",
                                     "--broker", "redis://127.0.0.1:1/0", "--option",
                                     "managment=none"])
    assert dramatiq_.exit_code == 2 and "unknown key 'managment'" in dramatiq_.output
    bare = runner.invoke(main, ["dlq", "list", "--framework", "celery", "--option", "backend"])
    assert bare.exit_code == 2 and "'backend' is not KEY=VALUE" in bare.output


#: The Celery app ``--app tests.dlq.test_cli:CELERY_APP`` names while a test runs.
CELERY_APP: Any = None


def test_dlq_refuses_a_dead_letter_queue_s_name_where_the_original_queue_goes(
        redis_url: str) -> None:
    """``--queue trial_q.dead_letter`` (Celery) or ``trial_q.XQ`` (Dramatiq) looked for that
    queue's own dead-letter queue and listed 0 rows: exit 2, naming the original to pass.
    Names come from each framework's naming (the app's ``ojs_dead_letter_queue`` too)."""
    global CELERY_APP
    from celery import Celery

    queue = f"trial_{uuid.uuid4().hex[:8]}"
    runner = CliRunner()

    def run(framework: str, *args: str) -> Result:
        return runner.invoke(main, ["dlq", "list", "--framework", framework, *args])

    by_url = ("--broker", redis_url)
    for framework, dead in (("celery", f"{queue}.dead_letter"), ("dramatiq", f"{queue}.XQ")):
        refused = run(framework, *by_url, "--queue", dead)
        assert refused.exit_code == 2, refused.output
        assert f"Invalid value for '--queue': '{dead}' is the dead-letter queue of " \
               f"'{queue}': pass --queue {queue}" in refused.output
        listed = run(framework, *by_url, "--queue", queue, "--json")
        assert listed.exit_code == 0 and json.loads(listed.stdout)["total"] == 0, listed.output
    delay = run("dramatiq", *by_url, "--queue", f"{queue}.DQ")  # Dramatiq's delay queue
    assert delay.exit_code == 2 and f"pass --queue {queue}" in delay.output, delay.output
    CELERY_APP = Celery("trial", broker=redis_url, set_as_current=False)
    CELERY_APP.conf.ojs_dead_letter_queue = "dlq.{queue}"
    try:
        app = ("--app", "tests.dlq.test_cli:CELERY_APP")
        refused = run("celery", *app, "--queue", f"dlq.{queue}")
        assert refused.exit_code == 2 and f"pass --queue {queue}" in refused.output
        assert run("celery", *app, "--queue", f"{queue}.dead_letter").exit_code == 0
        CELERY_APP.conf.ojs_dead_letter_queue = "dead_letters"  # one queue for all
        shared = run("celery", *app, "--queue", "dead_letters")
        assert shared.exit_code == 2 and "'dead_letters' is the dead-letter queue every " \
            "queue shares: pass an original --queue" in shared.output
    finally:
        CELERY_APP = None
