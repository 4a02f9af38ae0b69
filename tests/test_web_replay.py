"""relay web and the journal: a run's steps with "Fork from here" (a form made for one
person and step, used once), a fork's page saying where it came from, and the diff
page; in a real chromium and over HTTP, against real workers."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from agent_core import Config, Policy
from tests.support.brain import call, final
from tests.support.fleet import Fleet, fleet
from tests.support.redis_server import RedisServer
from tests.support.web import RelayWeb, browser_page, screen
from workers import Relay, Settings
from workers.store import reads
from workers.web.views import journal_rows

APP = "tests.apps.notes:relay"
TRUSTING = Config(require_plan=False, policy=Policy.TRUSTING)


def _fork_forms(html: str) -> dict[int, dict[str, str]]:
    """The hidden fields of each "Fork from here" form in a run's page, by step."""
    forms = {}
    for form in re.findall(r'<form method="post" action="/runs/fork".*?</form>', html, re.S):
        fields = dict(re.findall(r'type="hidden" name="(\w+)" value="([^"]*)"', form))
        forms[int(fields["what"])] = fields
    return forms


def _written_and_read(f: Fleet) -> str:
    f.brain.script(
        "WEB-FORK",
        {0: call("write_note", name="w.txt", text="hello"), 1: call("read_note", name="w.txt"),
         2: final("wrote and read"), 3: final("and the new request")},
    )  # fmt: skip
    run_id = f.relay.start("WEB-FORK: write then read", config=TRUSTING)
    assert f.relay.wait(run_id, 60).summary == "wrote and read", f.logs()
    return run_id


@pytest.mark.timeout(240)
def test_fork_from_a_step_on_the_web_once_then_compare(tmp_path: Path) -> None:
    with fleet(tmp_path) as f, RelayWeb(f.env, tmp_path / "web.log", app=APP) as web:
        f.worker("--pool", "threads", "-c", "4")
        run_id = _written_and_read(f)
        steps = f.relay.replay(run_id).steps
        page = web.client.get(f"/runs/{run_id}").text
        forms = _fork_forms(page)
        assert sorted(forms) == list(range(1, steps + 1))  # a form at every step
        assert "<td>runs write_note</td>" in page

        form = {**forms[3], "stub": "1"}  # after the write's result: nothing runs again
        forged = [
            {**form, "what": "2"},  # this form, for another step
            {**form, "run": "someoneelse"},
            {k: v for k, v in form.items() if k != "token"},
        ]
        for fields in forged:
            assert web.client.post("/runs/fork", data=fields).status_code == 403, fields
        cross = web.client.post("/runs/fork", data=form, headers={"Sec-Fetch-Site": "cross-site"})
        assert cross.status_code == 403

        made = web.client.post("/runs/fork", data=form)
        assert made.status_code == 303, made.text
        fork_id = made.headers["location"].split("/runs/")[1].split("?")[0]
        again = web.client.post("/runs/fork", data=form)
        assert again.status_code == 403
        assert "this form was used already" in again.text
        assert f.relay.wait(fork_id, 60).summary == "wrote and read"
        assert f.ledger() == ["write_note w.txt"]  # once: the original's
        status = f.relay.status(fork_id)
        assert status.forked_from is not None
        assert (status.forked_from.run, status.forked_from.step) == (run_id, 3)
        forked_line = next(e for e in f.relay.trace(fork_id) if e.kind == "forked")
        assert forked_line.text == f"forked from run {run_id} at step 3; stubbed tools"

        shown = web.client.get(f"/runs/{fork_id}").text
        assert f'<a href="/runs/{run_id}">{run_id}</a> at step 3' in shown
        diff = web.client.get(f"/diff?a={run_id}&b={fork_id}")
        assert diff.status_code == 200
        assert "The same steps, as far as both went." in diff.text
        assert diff.text.count("<td>no price</td>") == 2  # as the run pages say it

        # At the step the run ended, a fork needs a new request: it begins a new turn.
        ended = _fork_forms(web.client.get(f"/runs/{run_id}").text)[steps]
        refused = web.client.post("/runs/fork", data=ended)
        assert refused.status_code == 409
        assert "had ended: nothing is left to run" in refused.text
        ended = _fork_forms(web.client.get(f"/runs/{run_id}").text)[steps]
        turn = web.client.post("/runs/fork", data={**ended, "task": "one more thing"})
        assert turn.status_code == 303, turn.text
        new_turn = turn.headers["location"].split("/runs/")[1].split("?")[0]
        assert f.relay.wait(new_turn, 60).summary == "and the new request"
        assert web.client.get("/diff?a=nosuchrun&b=" + fork_id).status_code == 404

        with browser_page(web) as browser:
            _fork_in_the_browser(browser, run_id, f)

    # Without the app, relay web cannot replay a run: no fork forms, and it says why.
    (tmp_path / "bare").mkdir()
    with fleet(tmp_path / "bare") as f, RelayWeb(f.env, tmp_path / "bare.log") as bare:
        f.worker("--pool", "threads", "-c", "2")
        run_id = _written_and_read(f)
        page = bare.client.get(f"/runs/{run_id}").text
        assert 'id="steps"' in page
        assert _fork_forms(page) == {}
        assert "Forking needs <code>relay --app MODULE:ATTR web</code>" in page


def _fork_in_the_browser(page: Any, run_id: str, f: Fleet) -> None:
    page.goto(f"/runs/{run_id}")
    page.locator("#steps").scroll_into_view_if_needed()
    screen(page, "run-steps")
    row = page.locator("#steps tr[data-step='1']")
    row.locator("input[name='stub']").uncheck()  # not stubbed: the write runs again
    row.locator("button.fork").click()
    page.wait_for_url(re.compile(r"/runs/[0-9a-f]+\?said="))
    fork_id = page.url.split("/runs/")[1].split("?")[0]
    assert fork_id != run_id
    assert f"forked run {run_id} at step 1" in page.locator("p.said").inner_text()
    assert page.locator("#forked-from").inner_text().startswith(f"{run_id} at step 1")
    assert f.relay.wait(fork_id, 60).summary == "wrote and read"
    assert f.ledger() == ["write_note w.txt", "write_note w.txt"]
    page.click("#forked-from a:text('compare')")
    page.wait_for_url(re.compile(r"/diff\?"))
    screen(page, "diff")
    assert "The same steps" in page.locator("#first-difference").inner_text()


@pytest.mark.timeout(180)
def test_steps_end_as_the_run_ended_a_diff_says_what_differs_and_stubs_say_so(
    tmp_path: Path,
) -> None:
    with fleet(tmp_path) as f, RelayWeb(f.env, tmp_path / "web.log", app=APP) as web:
        f.worker("--pool", "threads", "-c", "4")
        f.brain.script("WEB-HALT", {0: call("delete_note", name="h.txt"), 1: final("deleted")})
        halted = f.relay.start("WEB-HALT: delete", config=Config(require_plan=False))
        f.until(lambda: bool(f.relay.status(halted).pending), what="the call to wait")
        asked = f.relay.replay(halted).steps
        f.relay.cancel(halted, "not now")
        f.relay.wait(halted, 60)
        steps = re.findall(
            r'<tr data-step="(\d+)">\s*<td>\d+</td>\s*<td>([^<]*)</td>',
            page := (web.client.get(f"/runs/{halted}").text),
        )
        assert steps[-1] == (str(asked + 1), "cancelled"), steps  # not "done"
        assert "done" not in [said for _, said in steps]
        assert 'placeholder="a new request (the run had ended here)"' in page  # at its end

        written = _written_and_read(f)
        fork = f.relay.fork(written, 1, stub_tools=True)  # the write: stubbed
        assert f.relay.wait(fork, 60).summary == "wrote and read"
        assert f.ledger() == ["write_note w.txt"]
        shown = web.client.get(f"/runs/{fork}").text
        made = re.findall(r'<code>(\w+)</code> <span class="made hint">([^<]*)</span>', shown)
        assert ("write_note", "stubbed: its recorded outcome, nothing ran") in made, made
        original = web.client.get(f"/runs/{written}").text
        made = re.findall(r'<code>(\w+)</code> <span class="made hint">([^<]*)</span>', original)
        assert [m for m in made if "stubbed" in m[1]] == []
        assert any(t == "write_note" and "attempt 1 on " in m for t, m in made), made

        diff = web.client.get(f"/diff?a={written}&b={halted}").text
        cells = re.findall(r'<td class="differs">([^<]*)</td>', diff)
        assert cells[:3] == [
            "first difference: prompt differs (what the model is shown of the run so far)",
            "tool differs: write_note -&gt; delete_note",
            "step differs: ask -&gt; cancelled",
        ], cells
        assert ">differs<" not in diff  # never a bare "differs"


def test_a_long_journal_shows_its_newest_steps_and_names_an_unreadable_one(
    tmp_path: Path,
) -> None:
    with RedisServer(tmp_path) as server:
        relay = Relay(settings=Settings.from_env({"RELAY_REDIS_URL": server.url}))
        key = relay.store.keys.journal("long")
        asked = '{"e":[],"s":{"k":"ask","d":"0123456789abcdef"}}'
        relay.store.redis.rpush(key, "z1:start", *[asked] * 299, "{broken")
        keys = relay.store.keys
        first, stored = relay.store.connection.drive(reads.journal_tail(keys, "long", 200))
        rows = journal_rows(first, stored)
        assert [row["step"] for row in rows] == list(range(101, 301))
        assert rows[0]["said"] == "waits for the model"
        assert rows[-1]["said"].startswith("unreadable: entry 300 cannot be read")
        assert relay.store.connection.drive(reads.journal_tail(keys, "nosuchrun", 200)) == (1, [])
