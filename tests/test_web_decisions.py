"""What a person approves is what runs: the whole call beside Approve (on the web, the
JSON API and the command line), Deny with a reason, and approving with edited arguments
checked as the model's were. Real workers, a real Redis, `relay web` and chromium."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.brain import call, final
from tests.support.cli import clean_env, relay
from tests.support.fleet import Fleet, fleet
from tests.support.web import RelayWeb, browser_page, form_of, screen

APP = "tests.apps.notes:relay"
HIDDEN = "THEN-ALSO-WIRE-TO-ATTACKER-IBAN"
LONG_NAME = "n" * 4_960 + HIDDEN  # 5,000 characters of arguments, the tail the one that matters


def _waiting(f: Fleet, marker: str, first_call: str, **more: Any) -> str:
    """A run of `marker` waiting for a person to decide its first call."""
    f.brain.script(marker, {0: first_call, 1: final(f"{marker} done"), **more})
    run_id = f.relay.start(f"{marker}: do it")
    f.until(lambda: f.relay.status(run_id).state == "waiting", what="the run to wait")
    return run_id


@pytest.mark.timeout(180)
def test_a_long_call_is_shown_whole_before_it_can_be_approved(tmp_path: Path) -> None:
    with fleet(tmp_path) as f, RelayWeb(f.env, tmp_path / "web.log", app=APP) as web:
        f.worker("--pool", "threads", "-c", "4")
        run_id = _waiting(f, "LONG-1", call("delete_note", name=LONG_NAME))

        # The command line shows every character, the hidden tail included.
        listed = relay("pending", env=clean_env(**f.env))
        assert listed.returncode == 0, listed.stderr
        assert HIDDEN in listed.stdout
        assert "(risk write)" in listed.stdout
        shown = relay("show", run_id, env=clean_env(**f.env))
        assert HIDDEN in shown.stdout
        # The JSON API gives the arguments whole.
        [pending] = web.client.get("/api/pending").json()
        assert pending["args"] == {"name": LONG_NAME}
        assert pending["args_long"] is True

        # An approval from a page where the whole call was never opened is refused.
        form = {**form_of(web.client.get("/approvals").text, run_id, "call-1")}
        refused = web.client.post("/approvals/decide", data={**form, "decision": "approve"})
        assert refused.status_code == 409
        assert "open the whole call (5,0" in refused.text
        assert f.relay.status(run_id).state == "waiting"

        with browser_page(web) as page:
            page.set_viewport_size({"width": 1400, "height": 900})
            for path in ("/approvals", f"/runs/{run_id}"):
                page.goto(path)
                screen(page, "approvals-long-call" if path == "/approvals" else "run-long-call")
                place = page.locator("[data-what='call-1']").first
                approve = place.locator("button.approve")
                assert approve.is_disabled()
                assert place.locator("details.whole-args pre.args").is_hidden()
                assert place.locator(".risk").first.inner_text().lower() == "write"
            place.locator("details.whole-args summary").click()
            whole = place.locator("details.whole-args pre.args")
            assert whole.is_visible()
            screen(page, "run-long-call-opened", whole=False)
            assert json.loads(whole.inner_text()) == {"name": LONG_NAME}  # every character
            assert approve.is_enabled()
            approve.click()
            page.wait_for_url("**/approvals?said=*")
        assert f.relay.wait(run_id, timeout=30).summary == "LONG-1 done"
        assert f.ledger() == [f"delete_note {LONG_NAME}"]


@pytest.mark.timeout(180)
def test_deny_on_the_web_takes_a_reason_the_model_is_told(tmp_path: Path) -> None:
    with fleet(tmp_path) as f, RelayWeb(f.env, tmp_path / "web.log", app=APP) as web:
        f.worker("--pool", "threads", "-c", "4")
        run_id = _waiting(f, "DENY-1", call("delete_note", name="keep.txt"))
        with browser_page(web) as page:
            page.goto(f"/runs/{run_id}")
            page.fill("form.decide input.reason", "that note is still needed")
            page.click("form.decide button.deny")
            page.wait_for_url("**/approvals?said=*")
        assert f.relay.wait(run_id, timeout=30).summary == "DENY-1 done"
        assert f.ledger() == []
        [declined] = [e for e in f.relay.trace(run_id) if e.kind == "declined"]
        assert (declined.text, declined.data) == ("that note is still needed", {"by": "alice"})
        assert any("that note is still needed" in c.prompt for c in f.model.calls)

        # Cancel, on the run page, with a reason: it goes into the outcome.
        stopped = _waiting(f, "CANCEL-1", call("delete_note", name="x.txt"))
        with browser_page(web) as page:
            page.goto(f"/runs/{stopped}")
            page.fill("form.cancel-run input.reason", "wrong task")
            page.click("#cancel")
            page.wait_for_url(f"**/runs/{stopped}?said=*")
            assert "cancelling run" in page.locator("p.said").inner_text()
            page.wait_for_selector("#run-outcome", timeout=30_000)
            assert "cancelled" in page.locator("#run-outcome").inner_text()
            assert page.locator("#cancel").count() == 0  # a finished run has none
        outcome = f.relay.wait(stopped, timeout=30)
        assert (outcome.stop.value, outcome.summary) == ("cancelled", "wrong task")
        assert f.ledger() == []


@pytest.mark.timeout(240)
def test_approve_with_edits(tmp_path: Path) -> None:
    with fleet(tmp_path) as f, RelayWeb(f.env, tmp_path / "web.log", app=APP) as web:
        f.worker("--pool", "threads", "-c", "4")

        # A good edit, in the browser: the edited call runs, the trace has both versions and
        # who edited, and the model is told what really ran.
        good = _waiting(f, "EDIT-1", call("delete_note", name="old.txt"))
        with browser_page(web) as page:
            page.goto("/approvals")
            place = page.locator(f"tr.pending[data-run='{good}']")
            place.locator("details.edit summary").click()
            place.locator("textarea[name=args]").fill('{"name": "older.txt"}')
            screen(page, "approvals-edit")
            place.locator("button.approve-edited").click()
            page.wait_for_url("**/approvals?said=*")
            assert "with edited arguments" in page.locator("p.said").inner_text()
        assert f.relay.wait(good, timeout=30).summary == "EDIT-1 done"
        assert f.ledger() == ["delete_note older.txt"]
        [edited] = [e for e in f.relay.trace(good) if e.kind == "edited"]
        assert edited.data == {"was": {"name": "old.txt"}, "now": {"name": "older.txt"},
                               "by": "alice"}  # fmt: skip
        told = [c.prompt for c in f.model.calls if "EDIT-1" in c.prompt]
        assert 'it ran with {"name": "older.txt"}' in told[-1]

        # An edit that fails the tool's declaration: refused, and the call stays pending.
        money = _waiting(f, "EDIT-2", call("pay", amount=12.5))
        page_html = web.client.get("/approvals").text
        form = form_of(page_html, money, "call-1")
        bad = {**form, "decision": "approve_edited", "args": '{"amount": "lots"}'}
        answer = web.client.post("/approvals/decide", data=bad)
        assert answer.status_code == 409
        assert "the edited arguments are refused" in answer.text
        assert "amount" in answer.text
        assert [p.call_id for p in f.relay.status(money).pending] == ["call-1"]
        not_json = web.client.post(
            "/approvals/decide", data={**form, "decision": "approve_edited", "args": "{amount"}
        )
        assert not_json.status_code == 400
        assert "not JSON" in not_json.text

        # On a MONEY call, through the JSON API: the edited amount is what is paid.
        api = f"/api/runs/{money}/calls/call-1/decision"
        wrong = web.client.post(api, json={"approve": True, "args": {"amount": "lots"}})
        assert wrong.status_code == 409
        assert f.relay.status(money).state == "waiting"
        done = web.client.post(api, json={"approve": True, "args": {"amount": 5}})
        assert done.status_code == 200, done.text
        assert f.relay.wait(money, timeout=30).summary == "EDIT-2 done"
        assert f.ledger()[-1] == "pay 5"
        late = web.client.post(api, json={"approve": True, "args": {"amount": 9}})
        assert late.status_code == 409  # decided already

        # The same edit form sent twice: the second is refused; nothing runs twice.
        third = _waiting(f, "EDIT-3", call("delete_note", name="a.txt"))
        form = form_of(web.client.get("/approvals").text, third, "call-1")
        edit = {**form, "decision": "approve_edited", "args": '{"name": "b.txt"}'}
        assert web.client.post("/approvals/decide", data=edit).status_code == 303
        again = web.client.post("/approvals/decide", data=edit)
        assert again.status_code == 403
        assert "used already" in again.text
        assert f.relay.wait(third, timeout=30).summary == "EDIT-3 done"
        assert f.ledger().count("delete_note b.txt") == 1
        assert "delete_note a.txt" not in f.ledger()


@pytest.mark.timeout(120)
def test_approve_with_an_args_file_on_the_command_line(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        f.worker("--pool", "threads", "-c", "4")
        run_id = _waiting(f, "FILE-1", call("pay", amount=100))
        env = clean_env(**f.env)
        edits = tmp_path / "edit.json"
        edits.write_text('{"amount": "all of it"}')
        refused = relay("--app", APP, "approve", run_id, "call-1", "--args-file", str(edits),
                        env=env)  # fmt: skip
        assert refused.returncode == 1
        assert "the edited arguments are refused" in refused.stderr
        bare = relay("approve", run_id, "call-1", "--args-file", str(edits), env=env)
        assert bare.returncode == 1
        assert "--app" in bare.stderr  # no app: no tool to check the edit against
        edits.write_text('{"amount": 7}')
        approved = relay("--app", APP, "approve", run_id, "call-1", "--args-file", str(edits),
                         env=env)  # fmt: skip
        assert approved.returncode == 0, approved.stderr
        assert "with edited arguments" in approved.stdout
        assert f.relay.wait(run_id, timeout=30).summary == "FILE-1 done"
        assert f.ledger() == ["pay 7"]

        # An edit that reaches Redis unchecked (a client that skips the check, or anyone
        # with Redis access): the worker checks it again and declines the call.
        forged = _waiting(f, "FORGED-1", call("pay", amount=3))
        f.relay.runs_client.approve(forged, "call-1", True, args={"amount": "lots"}, by="eve")
        assert f.relay.wait(forged, timeout=30).summary == "FORGED-1 done"
        assert f.ledger() == ["pay 7"]  # nothing more was paid
        [declined] = [e for e in f.relay.trace(forged) if e.kind == "declined"]
        assert declined.text.startswith("the edited arguments were refused: ")
