"""Reading retry settings from Ruby, YAML and JSON files and directories (issue 6)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ojs_adapters import OjsValidationError
from ojs_adapters.migrate import (
    Band,
    Fidelity,
    FidelityRow,
    load_document,
    migrate_path,
    migrate_text,
    read_ruby,
)
from ojs_adapters.migrate._common import jitter_mean
from ojs_adapters.migrate._ruby_literals import Dynamic

RUBY = '''
class HardJob
  include Sidekiq::Job
  sidekiq_options retry: 5, dead: false # five, then drop
end

module Billing
  class ChargeJob < ApplicationJob
    sidekiq_options(queue: "critical",
                    :retry => 0,
                    "retry_for" => 48.hours, dead: ENV["KEEP_DEAD"])
    sidekiq_retry_in do |count, exception|
      case exception
      when CardStolen then :kill
      when Stale
        :discard
      end
    end
  end
end

class TunedJob
  sidekiq_options retry: MAX_RETRIES, tags: ["a", "b"], note: "has # hash"
end
'''


def test_literal_sidekiq_options_are_read() -> None:
    jobs = {job.name: job for job in read_ruby(RUBY)}
    assert jobs["HardJob"].options == {"retry": 5, "dead": False}
    assert jobs["HardJob"].dynamic == ()
    charge = jobs["Billing::ChargeJob"]  # named as Ruby names it, with its module
    assert charge.options["retry"] == 0
    assert charge.options["retry_for"] == 172_800
    assert charge.options["queue"] == "critical"


def test_dynamic_ruby_is_reported_not_guessed() -> None:
    jobs = {job.name: job for job in read_ruby(RUBY)}
    charge = jobs["Billing::ChargeJob"]
    assert isinstance(charge.options["dead"], Dynamic)
    # A block of literal answers is read (issue 16); only the ENV[...] value stays dynamic.
    assert charge.options["sidekiq_retry_in"] == {"CardStolen": ":kill", "Stale": ":discard",
                                                  "*": None}
    assert [line for line, _ in charge.dynamic] == [9]  # the line the call starts on
    tuned = jobs["TunedJob"]
    assert tuned.options["note"] == "has # hash"
    assert isinstance(tuned.options["retry"], Dynamic)


def test_a_block_that_is_code_stays_dynamic() -> None:
    text = ("class A\n  sidekiq_options retry: 3\n  sidekiq_retry_in do |count, exception|\n"
            "    exception.retry_after || :kill\n  end\nend\n")
    [job] = read_ruby(text)
    assert isinstance(job.options["sidekiq_retry_in"], Dynamic)
    assert ":kill" in job.options["sidekiq_retry_in"]
    assert [line for line, _ in job.dynamic] == [3]


def test_retry_in_blocks_on_one_line_do_not_swallow_what_follows() -> None:
    text = ("class A\n  sidekiq_options retry: 2\n  sidekiq_retry_in do |c| 10 * c end\nend\n"
            "class B\n  sidekiq_options retry: 4\n  sidekiq_retry_in { |c| :kill }\nend\n"
            "class C\n  sidekiq_options retry: 1\nend\n")
    jobs = {job.name: job for job in read_ruby(text)}
    assert sorted(jobs) == ["A", "B", "C"]
    assert jobs["C"].options == {"retry": 1}
    assert jobs["B"].options["sidekiq_retry_in"] == {"*": ":kill"}
    assert jobs["A"].options["sidekiq_retry_in"] == {"*": "10 * count"}


def test_default_job_options_are_read() -> None:
    text = 'Sidekiq.default_job_options = { "retry" => 3, "dead" => false }\n'
    [job] = read_ruby(text)
    assert (job.name, job.options) == ("Sidekiq.default_job_options", {"retry": 3, "dead": False})


def test_ruby_file_migration_keeps_origin_lines(tmp_path: Path) -> None:
    (tmp_path / "jobs.rb").write_text(RUBY)
    found = {m.name: m for m in migrate_path("sidekiq", tmp_path)}
    assert found["HardJob"].policy.max_attempts == 6  # type: ignore[union-attr]
    assert found["HardJob"].origin.endswith("jobs.rb:4")  # type: ignore[union-attr]
    assert found["Billing::ChargeJob"].policy is None  # dead: ENV[...] decides where it goes
    assert found["TunedJob"].policy is None
    assert any("line 9" in n.text for n in found["Billing::ChargeJob"].notes)


def test_a_job_takes_its_superclass_and_sidekiq_wide_options_across_files(
        tmp_path: Path) -> None:
    """Sidekiq merges a class's ``sidekiq_options`` into its superclass's, over the app's
    defaults (``default_job_options``, ``config[:max_retries]``), wherever they are."""
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "sidekiq.rb").write_text(
        "Sidekiq.configure_server do |config|\n  config[:max_retries] = 7\nend\n")
    (tmp_path / "jobs.rb").write_text(
        "class ApplicationJob\n  include Sidekiq::Job\n  sidekiq_options retry: 3, dead: false\n"
        "  sidekiq_retries_exhausted do |job, ex|\n    Alert.call(job)\n  end\nend\n\n"
        "class ChildJob < ApplicationJob\n  sidekiq_options queue: 'low'\nend\n\n"
        "class PlainChild < ApplicationJob\nend\n\n"
        "class Money < Struct\nend\n\n"
        "class ReportJob\n  include Sidekiq::Job\nend\n")
    found = {m.name: m for m in migrate_path("sidekiq", tmp_path)}
    assert set(found) == {"Sidekiq[:max_retries]", "ApplicationJob", "ChildJob", "PlainChild",
                          "ReportJob"}  # Money is no job
    for name in ("ApplicationJob", "ChildJob", "PlainChild"):
        policy = found[name].policy
        assert policy is not None
        assert (policy.max_attempts, policy.on_exhaustion) == (4, "discard"), name
        assert found[name].lossy  # the exhausted block is inherited, and no policy holds it
        assert any(n.field == "sidekiq_retries_exhausted" for n in found[name].notes)
    assert any("inherited from ApplicationJob" in n.text for n in found["ChildJob"].notes)
    report = found["ReportJob"].policy
    assert report is not None and report.max_attempts == 8  # config[:max_retries] = 7
    assert found["ReportJob"].origin.endswith("jobs.rb:19")  # type: ignore[union-attr]
    assert not found["ReportJob"].lossy


def _rows(tmp_path: Path, files: dict[str, str]) -> dict[str | None, Any]:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return {m.name: m for m in migrate_path("sidekiq", tmp_path)}


def test_classes_are_named_and_closed_as_ruby_does(tmp_path: Path) -> None:
    found = _rows(tmp_path, {
        "hard_job.rb": "class HardJob\n  include Sidekiq::Job\n"
                       "  class RateLimited < StandardError; end\n"
                       "  class Inner < StandardError\n  end\n"
                       "  sidekiq_options retry: 5, dead: false\nend\n",
        "billing.rb": "module Billing\n  class SyncJob\n    include Sidekiq::Job\n"
                      "    sidekiq_options retry: 1\n  end\nend\n",
        "crm.rb": "module Crm\n  class SyncJob\n    include Sidekiq::Job\n"
                  "    sidekiq_options retry: 10, dead: false\n  end\nend\n",
        "jobs/base.rb": "module Jobs\n  class Base\n    include Sidekiq::Job\n"
                        "    sidekiq_options retry: 3, dead: false\n  end\nend\n",
        "charge.rb": "module Billing\n  class ChargeJob < Jobs::Base\n  end\n"
                     "  class RefundJob < ::Jobs::Base\n    sidekiq_options queue: 'low'\n"
                     "  end\nend\nmodule Serializers\n  class Base\n  end\n"
                     "  class UserSerializer < Base\n  end\nend\n",
        "report.rb": "class ReportJob < ApplicationJob\nend\n\nclass ReportJob\n"
                     "  def helper; end\nend\n",
        "app.rb": "class ApplicationJob\n  include Sidekiq::Job\n  sidekiq_options retry: 2\n"
                  "end\n",
    })
    attempts = {name: (m.policy.max_attempts, m.policy.on_exhaustion)
                for name, m in found.items() if m.policy is not None}
    assert attempts == {
        "HardJob": (6, "discard"), "Billing::SyncJob": (2, "dead_letter"),
        "Crm::SyncJob": (11, "discard"), "Jobs::Base": (4, "discard"),
        "Billing::ChargeJob": (4, "discard"), "Billing::RefundJob": (4, "discard"),
        "ReportJob": (3, "dead_letter"), "ApplicationJob": (3, "dead_letter")}
    assert found["HardJob"].origin.endswith("hard_job.rb:6")  # type: ignore[union-attr]


def test_inherited_blocks_concerns_and_sidekiq_wide_settings_say_where_they_are(
        tmp_path: Path) -> None:
    found = _rows(tmp_path, {
        "a_child.rb": "class ChildJob < ApplicationJob\n  sidekiq_options queue: 'low'\nend\n",
        "b_base.rb": "class ApplicationJob\n  include Sidekiq::Job\n  include Retryable\n"
                     "  sidekiq_retries_exhausted do |job, ex|\n    Alert.call(job)\n  end\n"
                     "end\n",
        "c_concern.rb": "module Retryable\n  extend ActiveSupport::Concern\n  included do\n"
                        "    sidekiq_options retry: 4, dead: false\n  end\nend\n",
        "d_client.rb": "class Client\n  def opts\n    h = {}\n    h[:max_retries] = 2\n"
                       "  end\nend\n",
        "config/sidekiq.yml": ":concurrency: 5\n:max_retries: 7\n:queues:\n  - default\n",
        "e_plain.rb": "class PlainJob\n  include Sidekiq::Job\nend\nclass OrphanJob < Gone\n"
                      "  sidekiq_options queue: 'x'\nend\n",
    })
    assert "Retryable" not in found  # a concern some class includes is no row of its own
    child = found["ChildJob"]
    assert child.policy is not None
    assert (child.policy.max_attempts, child.policy.on_exhaustion) == (5, "discard")
    [exhausted] = [n for n in child.notes if n.field == "sidekiq_retries_exhausted"]
    assert "b_base.rb:4" in exhausted.text and child.lossy
    plain = found["PlainJob"].policy
    assert plain is not None and plain.max_attempts == 8  # sidekiq.yml's :max_retries: 7
    assert None not in found  # the config file is no job of its own
    orphan = found["OrphanJob"]
    assert any("superclass Gone is not in the files read" in n.text for n in orphan.notes)


def test_what_is_not_sidekiq_code_stays_out_of_the_options(tmp_path: Path) -> None:
    """Heredocs, Class.new, tabs, a BOM, ActiveJob's own retries, a client's settings."""
    found = _rows(tmp_path, {
        "mail.rb": "class MailJob\n  include Sidekiq::Job\n  TEMPLATE = <<~RUBY\n"
                   "    class Foo < Bar\n      sidekiq_options retry: 99\n    end\n  RUBY\n"
                   "  sidekiq_options retry: 2\nend\n",
        "host.rb": "class HostJob\n  include Sidekiq::Job\n  sidekiq_options retry: 1\n"
                   "  Inner = Class.new(ApplicationJob) do\n    sidekiq_options retry: 7\n"
                   "  end\nend\nclass ApplicationJob\n  include Sidekiq::Job\nend\n",
        "tabs.rb": "module Mixed\n  class AJob\n\tinclude Sidekiq::Job\n"
                   "\tclass Err < StandardError\n        end\n\tsidekiq_options retry: 2\n"
                   "  end\nend\n",
        "bom.rb": "\ufeffclass BomJob\n  include Sidekiq::Job\n  self.sidekiq_options retry: 3\n"
                  "end\n",
        "import.rb": "class ImportJob < ActiveJob::Base\n  retry_on Net::ReadTimeout, "
                     "attempts: 10\n  sidekiq_options retry: 2\nend\n",
        "init.rb": "Sidekiq.configure_client do |config|\n  config[:max_retries] = 1\nend\n"
                   "Sidekiq.configure_server do |config|\n  config.redis = {}\nend\n"
                   "class HttpClient\n  def setup(config)\n    config[:max_retries] = 1\n"
                   "  end\nend\n",
        "config/locales/en.yml": "en:\n  hello: world\n",
        "config/sidekiq.yml": ":concurrency: 5\n:max_retries: 10\nproduction:\n"
                              "  :max_retries: 5\n",
    })
    attempts = {name: m.policy.max_attempts for name, m in found.items() if m.policy}
    assert attempts == {"MailJob": 3, "HostJob": 2, "HostJob::Inner": 8, "ApplicationJob": 6,
                        "Mixed::AJob": 3, "BomJob": 4, "ImportJob": 3,
                        "Sidekiq[:max_retries]": 6}  # production's 5; en.yml no job
    assert [n.field for n in found["ImportJob"].notes if n.severity == "lossy"] == ["retry_on"]
    assert not any("superclass" in n.text for n in found["ImportJob"].notes)


def test_sidekiq_yml_erb_is_left_unevaluated_and_initializers_win(tmp_path: Path) -> None:
    found = _rows(tmp_path, {
        "config/sidekiq.yml": ":max_retries: <%= ENV.fetch('RETRIES', 3) %>\n",
        "unclosed.rb": "class OpenJob\n  include Sidekiq::Job\n  sidekiq_options retry: 1\n",
    })
    assert found["Sidekiq[:max_retries]"].policy is None  # ERB: not a literal, said
    assert any("could not be followed" in n.text for n in found["OpenJob"].notes)
    later = _rows(tmp_path / "b", {
        "config/sidekiq.yml": ":max_retries: 12\n",
        "config/initializers/sidekiq.rb": "Sidekiq.configure_server do |config|\n"
                                          "  config[:max_retries] = 3\nend\n",
        "app/jobs/report_job.rb": "class ReportJob\n  include Sidekiq::Job\nend\n"})
    assert later["ReportJob"].policy is not None
    assert later["ReportJob"].policy.max_attempts == 4  # the initializer runs after the file


def test_code_that_looks_like_a_heredoc_is_still_read(tmp_path: Path) -> None:
    found = _rows(tmp_path, {"jobs.rb": (
        "$:<<File.dirname(__FILE__)\nHELP = \"usage: cat <<EOF\"\n"
        "class Collect\n  class <<self\n    def go; end\n  end\n  def run\n    out = []\n"
        "    out<<1\n    out <<VALUE\n  end\nend\n"
        "::Sidekiq.configure_server do |config|\n  config[:max_retries] = 7\nend\n"
        "class HardJob < StructuredJob\n  include Sidekiq::Job\n  sidekiq_options retry: 3\n"
        "end\nclass SqlJob\n  include Sidekiq::Job\n  SQL = <<~SQL\n    class Nope\n"
        "      sidekiq_options retry: 99\n    end\n  SQL\nend\n")})
    assert found["HardJob"].policy is not None and found["HardJob"].policy.max_attempts == 4
    assert any("superclass StructuredJob" in n.text for n in found["HardJob"].notes)
    assert found["SqlJob"].policy is not None and found["SqlJob"].policy.max_attempts == 8
    assert "SqlJob::Nope" not in found


def test_a_directory_scan_keeps_every_spelling_a_dialect_reads(tmp_path: Path) -> None:
    (tmp_path / "workers.yml").write_text("emails:\n  retry_backoff_base_ms: 100\n"
                                          "  max_retries: 3\n")
    (tmp_path / "en.yml").write_text("en:\n  hello: world\n")
    assert [m.name for m in migrate_path("queue", tmp_path)] == ["emails"]
    (tmp_path / "actors.yml").write_text("send_email:\n  on_retry_exhausted: notify\n")
    assert "send_email" in [m.name for m in migrate_path("dramatiq", tmp_path)]
    (tmp_path / "jobs.json").write_text('[{"class": "B", "args": [1]}]')
    assert "B" in [m.name for m in migrate_path("sidekiq", tmp_path)]


def test_a_reopened_class_or_a_concern_keeps_its_activejob_retries(tmp_path: Path) -> None:
    found = _rows(tmp_path, {
        "a.rb": "class ImportJob < ActiveJob::Base\n  include Retrying\n"
                "  sidekiq_options retry: 2\nend\n",
        "b.rb": "class ImportJob\n  retry_on Net::ReadTimeout, attempts: 5\nend\n",
        "c.rb": "module Retrying\n  extend ActiveSupport::Concern\n  included do\n"
                "    discard_on Gone\n  end\nend\n",
        "d.rb": "class ExportJob\n  include Sidekiq::Job\nend\nclass ExportJob\n  def x\n",
    })
    lines = sorted(n.text.split(":")[0].rsplit("/", 1)[-1] + n.text.split(":")[1]
                   for n in found["ImportJob"].notes if n.field == "retry_on")
    assert lines == ["b.rb2", "c.rb4"]  # the reopened class's and the concern's
    assert any("could not be followed" in n.text for n in found["ExportJob"].notes)


ruby_values = st.fixed_dictionaries(
    {"retry": st.one_of(st.booleans(), st.integers(0, 100))},
    optional={"dead": st.booleans(), "retry_for": st.integers(1, 30),
              "queue": st.sampled_from(["default", "low"])})


@settings(max_examples=50, deadline=None)
@given(options=ruby_values, rocket=st.booleans())
def test_ruby_literals_round_trip(options: dict[str, object], rocket: bool) -> None:
    def literal(key: str, value: object) -> str:
        if key == "retry_for":
            return f"{value}.days"
        if isinstance(value, bool):
            return "true" if value else "false"
        return f'"{value}"' if isinstance(value, str) else str(value)

    pairs = [f":{k} => {literal(k, v)}" if rocket else f"{k}: {literal(k, v)}"
             for k, v in options.items()]
    [job] = read_ruby("class J\n  sidekiq_options " + ", ".join(pairs) + "\nend\n")
    expected = {k: (v * 86_400 if k == "retry_for" else v) for k, v in options.items()}
    assert job.options == expected


def test_yaml_single_named_and_list_documents() -> None:
    assert [m.name for m in migrate_text("sidekiq", "retry: 3\n")] == [None]
    named = migrate_text("sidekiq", "HardJob:\n  retry: 3\nSoftJob:\n  retry: false\n")
    assert [(m.name, m.policy.max_attempts) for m in named] == [("HardJob", 4), ("SoftJob", 1)]  # type: ignore[union-attr]
    listed = migrate_text("bullmq", json.dumps([{"name": "mail", "attempts": 3}, {"attempts": 1}]))
    assert [(m.name, m.policy.max_attempts) for m in listed] == [("mail", 3), ("#1", 1)]  # type: ignore[union-attr]


def test_job_payloads_name_themselves() -> None:
    [m] = migrate_text("sidekiq", '{"class": "HardJob", "args": [1], "retry": 2}')
    assert (m.name, m.policy.max_attempts) == ("HardJob", 3)  # type: ignore[union-attr]
    [f] = migrate_text("faktory", '{"jobtype": "Webhook", "retry": -1}')
    assert f.name == "Webhook"


def test_sidekiq_yml_symbol_keys() -> None:
    [m] = migrate_text("sidekiq", ":max_retries: 7\n:concurrency: 5\n")
    assert m.policy.max_attempts == 8  # type: ignore[union-attr]


def test_directory_walk_reads_matching_files_only(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text('{"max_retries": 2}')
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.yaml").write_text("max_retries: 0\n")
    (tmp_path / "notes.txt").write_text("not options")
    found = migrate_path("celery", tmp_path)
    assert [m.policy.max_attempts for m in found] == [3, 1]  # type: ignore[union-attr]


@pytest.mark.parametrize("text", ["", "   ", "{{{", "- [unclosed"])
def test_unreadable_documents_raise_invalid_payload(text: str) -> None:
    with pytest.raises(OjsValidationError) as info:
        load_document(text, "x.yaml")
    assert info.value.code == "INVALID_PAYLOAD"
    assert info.value.details["field"] == "x.yaml"


def test_wrong_shapes_and_unknown_dialects() -> None:
    with pytest.raises(OjsValidationError):
        migrate_text("sidekiq", "42")
    with pytest.raises(OjsValidationError) as info:
        migrate_text("resque", "{}")
    assert info.value.details["field"] == "dialect"
    with pytest.raises(OjsValidationError):
        migrate_path("sidekiq", "/no/such/path")


def test_a_path_like_object_is_one_path(tmp_path: Path) -> None:
    """``os.PathLike`` (pytest's ``tmpdir``, say) reads as one path, as ``Path`` does."""
    (tmp_path / "jobs.rb").write_text(RUBY)

    class Where:
        def __fspath__(self) -> str:
            return str(tmp_path)

    assert {m.name for m in migrate_path("sidekiq", Where())} == \
        {m.name for m in migrate_path("sidekiq", tmp_path)}


# -- the model ------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(capped=st.floats(0.001, 1e6), factor=st.floats(0.5, 3.0))
def test_jitter_mean_matches_numeric_integration(capped: float, factor: float) -> None:
    cap = max(capped * factor, capped)
    steps = 4000
    numeric = sum(min(capped * (0.5 + (i + 0.5) / steps), cap) for i in range(steps)) / steps
    assert jitter_mean(capped=capped, cap=cap) == pytest.approx(numeric, rel=1e-4)


def test_fidelity_figures() -> None:
    rows = (FidelityRow(1, Band(10, 10, 10), Band(5, 15, 10)),
            FidelityRow(2, Band(10, 10, 10), Band(10, 30, 20)),
            FidelityRow(3, Band(10, 10, 10), Band(2, 6, 4)))
    fidelity = Fidelity(rows)
    assert fidelity.worst_ratio == 0.4  # 1/0.4 = 2.5 strays more than 2.0
    assert fidelity.worst is rows[2]
    assert fidelity.old_total == 30 and fidelity.new_total == 34
    assert not fidelity.exact
    assert Fidelity(()).worst_ratio == 1.0 and Fidelity(()).exact
    infinite = Fidelity((FidelityRow(1, Band(0, 0, 0), Band(1, 1, 1)),))
    assert math.isinf(infinite.worst_ratio)
    json.dumps(infinite.to_dict(), allow_nan=False)  # inf is written as null


def test_migration_json_is_plain() -> None:
    for text in ("retry: 3", "retry: false", "sidekiq_retry_in: {Foo: ':discard'}"):
        for m in migrate_text("sidekiq", text):
            json.dumps(m.to_dict(), allow_nan=False)


@pytest.mark.parametrize("module", [
    "ojs_adapters.migrate", "ojs_adapters.migrate._model", "ojs_adapters.migrate._common",
    "ojs_adapters.migrate._fit", "ojs_adapters.migrate._ruby", "ojs_adapters.migrate._files",
    "ojs_adapters.migrate.sidekiq", "ojs_adapters.migrate.faktory",
    "ojs_adapters.migrate.celery", "ojs_adapters.migrate.dramatiq",
    "ojs_adapters.migrate.bullmq", "ojs_adapters.migrate.temporal",
    "ojs_adapters.migrate.queue_backoff", "ojs_adapters.cli", "ojs_adapters.cli._io",
    "ojs_adapters.migrate._arith", "ojs_adapters.migrate._ruby_block",
    "ojs_adapters.migrate._sidekiq_delay", "ojs_adapters.migrate._sidekiq_errors",
])
def test_docstring_examples_run(module: str) -> None:
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module))
    assert result.failed == 0 and result.attempted > 0
