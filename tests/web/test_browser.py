"""The console in a real headless Chromium, against ``ojs-retry web`` and real workers (issue 19).

Four cells: Celery and Dramatiq, each on Redis and on RabbitMQ (records and
statistics in Redis). In each, workers fail three jobs (two dead-lettered, one
waiting 120 s for its retry), and the browser checks that the pages show them,
that markup in an error message stays text, that a POST without the token or the
CSRF token is refused and changes nothing, that a console without a token has no
action button, that 'replay' runs a dead job again to completion, that 'retry now'
runs a waiting retry early, and that after 'retry now' or 'discard' nothing more
happens: on Redis the retry left the parked set; on RabbitMQ its parked original
stays in the delay levels until due, and is then dropped unrun (no attempt, no dead
letter, no warning or error logged).

``OJS_WEB_SCREENSHOTS=1`` saves the pages of the Celery-on-Redis cell to
``docs/screenshots/`` (the README's pictures).
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.web.apps import BRISK_POLICY, HEALED, MARKUP, RUNS
from tests.web.support import (
    CHROMIUM,
    CHROMIUM_ARGS,
    ROOT,
    TOKEN,
    Running,
    logged,
    need_browser,
    running,
    wait_for,
)

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120)]

CELLS = [("celery", "redis"), ("celery", "amqp"), ("dramatiq", "redis"), ("dramatiq", "amqp")]
SHOTS = ROOT / "docs" / "screenshots"


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    need_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module", params=CELLS, ids=["-".join(c) for c in CELLS])
def cell(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
         browser: Any) -> Iterator[Running]:
    framework, kind = request.param
    from tests.brokers import require

    require("Redis", "127.0.0.1", 6379)
    if kind == "amqp":
        require("RabbitMQ", "127.0.0.1", 5672)
    with running(framework, kind, tmp_path_factory.mktemp("web")) as found:
        yield found


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    found = context.new_page()
    yield found
    context.close()


def shoot(cell: Running, page: Any, name: str) -> None:
    if os.environ.get("OJS_WEB_SCREENSHOTS") and cell.cell.spec.startswith("celery:redis"):
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / f"{name}.png"))


def reloaded(page: Any, text: str) -> bool:
    """Whether ``text`` is on the page, reloading it first."""
    page.reload()
    return text in page.inner_text("main")


def login(page: Any, server: str) -> None:
    page.goto(server + "/login")
    page.fill("input[name=token]", TOKEN)
    page.click("button[type=submit] >> text=Log in")
    page.wait_for_url(server + "/")


def test_pages_show_the_jobs_the_workers_failed(cell: Running, page: Any) -> None:
    server = cell.rw.url
    # overview: statistics flushed by the workers, dead-letter depth counted on the broker
    page.goto(server + "/")
    wait_for(lambda: reloaded(page, "web_doomed" if cell.cell.framework == "dramatiq"
                              else "web.doomed"), "the overview to show the tasks")
    text = page.inner_text("main")
    assert cell.cell.queue in text and "billing.Declined" in text and "net.Timeout" in text
    assert page.locator("svg.chart rect").count() >= 1
    shoot(cell, page, "overview")

    page.goto(server + "/dead-letters")
    rows = page.locator("#letters tbody tr")
    assert rows.count() == 2
    assert {rows.nth(i).get_attribute("data-id") for i in range(2)} == {cell.ids[1], cell.ids[2]}
    assert "2 dead letters" in page.inner_text("main")
    shoot(cell, page, "dead-letters")
    page.goto(server + f"/dead-letters?error=billing.*&queue={cell.cell.queue}")
    assert page.locator("#letters tbody tr").count() == 2
    page.goto(server + "/dead-letters?error=net.*")
    assert page.locator("#letters tbody tr").count() == 0

    page.goto(server + "/dead-letters")
    page.click(f'#letters tr[data-id="{cell.ids[1]}"] td:first-child a')
    history = page.locator("#history tbody tr")
    assert history.count() == 2  # attempts 1 and 2, then dead-lettered
    assert history.nth(0).locator("td").nth(1).inner_text() == "HANDLER_ERROR"
    text = page.inner_text("main")
    assert '"max_attempts": 2' in text and "idempotency key" in text
    assert "Hidden: job arguments" in text  # arguments stay hidden by default
    shoot(cell, page, "dead-letter")

    page.goto(server + f"/jobs?id={cell.ids[3]}")
    timeline = page.locator("#timeline tbody tr")
    assert timeline.count() == 1 and "120.000 s" in timeline.first.inner_text()
    assert "retryable" in page.inner_text("main")
    shoot(cell, page, "job")

    page.goto(server + "/waiting")  # parked: on Redis, or in the RabbitMQ levels' index
    wait_for(lambda: reloaded(page, cell.ids[3]), "the waiting retry")
    row = page.locator(f'#waiting tr[data-id="{cell.ids[3]}"]')
    assert "net.Timeout" in row.inner_text() and "2/3" in row.inner_text()
    if not cell.redis:
        assert "Listed from the index" in page.inner_text("main")
    shoot(cell, page, "waiting")


def test_markup_in_error_messages_is_shown_as_text(cell: Running, page: Any) -> None:
    for path in ("/dead-letters", f"/dead-letter?id={cell.ids[1]}&queue={cell.cell.queue}",
                 f"/jobs?id={cell.ids[2]}"):
        page.goto(cell.rw.url + path)
        assert MARKUP in page.inner_text("main")
        assert page.evaluate("window.__xss") is None
        assert page.locator("main script, main img").count() == 0


def _csrf(client: httpx.Client, url: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', client.get(url + "/login").text)
    assert found is not None
    return found.group(1)


def test_a_post_without_the_token_or_the_csrf_token_is_refused(cell: Running) -> None:
    url, victim = cell.rw.url, cell.ids[2]
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    replay = {"action": "replay", "id": victim, "queue": cell.cell.queue}
    with httpx.Client() as anonymous:
        assert anonymous.post(url + "/actions/dead-letters", data=replay).status_code == 403
        token = _csrf(anonymous, url)  # a CSRF token, but no operator token
        refused = anonymous.post(url + "/actions/dead-letters", data={**replay, "csrf": token})
        assert refused.status_code == 403 and "operator token" in refused.text
        waiting = {"action": "discard", "source": "parked", "id": cell.ids[3], "csrf": token}
        assert anonymous.post(url + "/actions/waiting", data=waiting).status_code == 403
    with httpx.Client(headers=bearer) as operator:  # the token, but no CSRF token
        refused = operator.post(url + "/actions/dead-letters", data={**replay, "csrf": "forged"})
        assert refused.status_code == 403 and "CSRF" in refused.text
        assert operator.post(url + "/actions/dead-letters", data=replay).status_code == 403
        assert operator.get(url + "/actions/dead-letters").status_code == 405  # POST only
    assert cell.dead_count() == 2
    assert (cell.record(cell.ids[3]) or pytest.fail("no record")).state == "retryable"
    assert cell.parked_count() == 1


def test_without_a_token_no_action_button_exists(cell: Running, page: Any) -> None:
    url = cell.ro.url
    for path in ("/dead-letters", f"/dead-letter?id={cell.ids[1]}&queue={cell.cell.queue}",
                 "/waiting", "/"):
        page.goto(url + path)
        assert page.locator("a.button, form[method=post]").count() == 0, path
        assert "read-only" in page.inner_text("header")
    assert httpx.get(url + f"/confirm?action=replay&id={cell.ids[1]}").status_code == 403
    refused = httpx.post(url + "/actions/dead-letters", data={
        "action": "delete", "id": cell.ids[1], "csrf": "x"},
        headers={"Authorization": f"Bearer {TOKEN}"})
    assert refused.status_code == 403 and "read-only" in refused.text
    assert cell.dead_count() == 2


def test_replay_from_the_dead_letters_page_runs_the_job_again(cell: Running,
                                                              page: Any) -> None:
    HEALED.add(1)
    login(page, cell.rw.url)
    page.goto(cell.rw.url + "/dead-letters")
    shoot(cell, page, "dead-letters")  # as an operator sees it: with the actions
    page.click(f'#letters tr[data-id="{cell.ids[1]}"] a:has-text("replay")')
    assert page.inner_text("h1") == "Replay 1 dead letter?"
    shoot(cell, page, "confirm")
    page.click("#confirm")
    assert "Replayed 1 dead letter" in page.inner_text(".notice")
    record = wait_for(lambda: (r := cell.record(cell.ids[1])) and r.state == "completed" and r,
                      "the replayed job to complete")
    assert record.extra["replay_count"] == 1 and [e.attempt for e in record.errors] == [1, 2]
    assert cell.dead_count() == 1
    page.goto(cell.rw.url + "/dead-letters")
    assert page.locator("#letters tbody tr").count() == 1


def test_retry_now_runs_a_waiting_retry_early(cell: Running, page: Any) -> None:
    HEALED.add(3)
    login(page, cell.rw.url)
    page.goto(cell.rw.url + "/waiting?source=parked")
    shoot(cell, page, "waiting")
    page.click(f'#waiting tr[data-id="{cell.ids[3]}"] a:has-text("retry now")')
    assert page.inner_text("h1") == "Run now 1 waiting retry?"
    page.click("#confirm")
    assert "will run now" in page.inner_text(".notice")
    record = wait_for(lambda: (r := cell.record(cell.ids[3])) and r.state == "completed" and r,
                      "the waiting retry to run now, not in 120 s", timeout=15)
    assert record.attempt == 2 and cell.parked_count() == 0
    for source in ("parked", "decided"):  # offered as waiting nowhere
        page.goto(cell.rw.url + f"/waiting?source={source}")
        assert cell.ids[3] not in page.inner_text("main")


#: Seconds a ``brisk`` retry waits.
BRISK = float(str(BRISK_POLICY["initial_interval"]).strip("PTS"))


def _act_on_brisk_job(cell: Running, page: Any, n: int, action: str) -> str:
    """Send brisk job ``n`` (it fails; its retry is parked for ``BRISK`` s), then
    ``action`` it from the Waiting retries page as soon as it is listed; its id. The job
    succeeds from then on."""
    login(page, cell.rw.url)
    job = cell.send("brisk", n)
    page.goto(cell.rw.url + "/waiting?source=parked")
    wait_for(lambda: reloaded(page, job), "the brisk retry to be listed")
    assert RUNS[n] == 1
    HEALED.add(n)
    page.click(f'#waiting tr[data-id="{job}"] a:has-text("{action}")')
    page.click("#confirm")
    return job


def _nothing_more_happens(cell: Running, job: str, records: list[logging.LogRecord],
                          dead: int) -> None:
    """Past the parked original's due time: on RabbitMQ it came and was dropped as a
    duplicate; nowhere did it run, count an attempt, dead-letter or log a warning."""
    if not cell.redis:
        wait_for(lambda: any(job in r.getMessage() and "duplicate" in r.getMessage().lower()
                             for r in records),
                 "the parked original to come due and be dropped", timeout=BRISK + 15)
    # on Redis, 'retry now' and 'discard' took the retry off the parked set: nothing comes
    time.sleep(1)  # anything the drop might have set off
    about = [r for r in records if job in r.getMessage()]
    assert [r.getMessage() for r in about if r.levelno >= logging.WARNING] == []
    assert [r.getMessage() for r in records if r.levelno >= logging.ERROR] == []
    assert cell.dead_count() == dead and cell.parked_count() == 0


def test_a_retry_run_early_is_not_run_again_when_it_would_have_come_due(
        cell: Running, page: Any) -> None:
    dead = cell.dead_count()
    job = _act_on_brisk_job(cell, page, 4, "retry now")
    with logged() as records:
        assert "1 waiting retry(ies) will run now" in page.inner_text(".notice")
        wait_for(lambda: (r := cell.record(job)) and r.state == "completed",
                 "the retry to run now", timeout=BRISK)
        assert job not in page.inner_text("#waiting")
        _nothing_more_happens(cell, job, records, dead)
    record = cell.record(job) or pytest.fail("no record")
    assert (record.state, record.attempt, [e.attempt for e in record.errors]) == (
        "completed", 2, [1])
    assert RUNS[4] == 2


def test_discard_drops_a_waiting_retry_for_good(cell: Running, page: Any) -> None:
    dead = cell.dead_count()
    job = _act_on_brisk_job(cell, page, 5, "discard")
    with logged() as records:
        assert "Discarded 1 waiting retry(ies)" in page.inner_text(".notice")
        record = cell.record(job) or pytest.fail("no record")
        assert (record.state, record.outcome, record.attempt) == ("discarded", "discarded", 1)
        assert job not in page.inner_text("#waiting")
        _nothing_more_happens(cell, job, records, dead)
    record = cell.record(job) or pytest.fail("no record")
    assert (record.state, record.attempt, record.dead_lettered) == ("discarded", 1, False)
    assert RUNS[5] == 1
