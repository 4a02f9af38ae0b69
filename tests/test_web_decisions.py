"""What a person approves is what runs: the whole call beside Approve (on the web, the
JSON API and the command line), Deny with a reason, and approving with edited arguments
checked as the model's were (and no edit form where an edit would be refused); questions
answered and budgets raised on the web like approvals. Real workers, a real Redis,
`relay web` and chromium."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.brain import call, final
from tests.support.cli import clean_env, relay
from tests.support.fleet import Fleet, fleet
from tests.support.waiting import pending_for
from tests.support.web import RelayWeb, browser_page, form_of, screen
from workers import Budget

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


# --- questions and budgets, answered and raised on the web ------------------------------


def _ask(question: str) -> str:
    return json.dumps({"ask_user": question})


@pytest.mark.timeout(180)
def test_a_question_is_answered_on_the_web_and_the_run_goes_on(tmp_path: Path) -> None:
    with fleet(tmp_path) as f, RelayWeb(f.env, tmp_path / "web.log") as web:
        f.worker("--pool", "threads", "-c", "4")
        script = {0: _ask("Which month?"), 1: _ask("Which year?"), 2: final("the report")}
        f.brain.script("ASK-W:", script)
        run_id = f.relay.start("ASK-W: write the report")
        first = pending_for(f, run_id, "question")

        # The form is made for this person and this question, like an approval's.
        stale = form_of(web.client.get("/approvals").text, run_id, str(first.seq))
        assert stale["kind"] == "question"
        said = {**stale, "decision": "answer", "answer": "May"}
        cross = web.client.post("/approvals/decide", data=said, headers={"Origin": "http://evil"})
        assert cross.status_code == 403
        anonymous = httpx.Client(base_url=web.url, timeout=10)
        with anonymous:
            assert anonymous.post("/approvals/decide", data=said).status_code == 401
        unsigned = {k: v for k, v in said.items() if k != "token"}
        assert web.client.post("/approvals/decide", data=unsigned).status_code == 403
        empty = web.client.post("/approvals/decide", data={**said, "answer": "  "})
        assert (empty.status_code, "write the answer" in empty.text) == (400, True)
        assert f.relay.status(run_id).waiting_for == "question"

        # Answered elsewhere, the run asks its next question: the form for the first one
        # is refused, and does not answer the question it never showed.
        f.relay.answer(run_id, "June", by="bob")
        f.until(lambda: _question_seq(f, run_id) not in (None, first.seq), what="question 2")
        refused = web.client.post("/approvals/decide", data=said)
        assert refused.status_code == 409
        assert "the question of run" in refused.text
        assert "no longer pending" in refused.text
        assert f.relay.status(run_id).waiting_for == "question"

        # The JSON API answers as the page does: by the question's step, as JSON only.
        api = f"/api/runs/{run_id}/answer"
        old_step = web.client.post(api, json={"text": "2024", "step": first.seq})
        assert (old_step.status_code, "no longer pending" in old_step.json()["error"]) == (
            409, True
        )  # fmt: skip
        assert web.client.post(api, data={"text": "2024"}).status_code == 415
        assert web.client.post(api, json={"text": " ", "step": 1}).status_code == 400
        assert f.relay.status(run_id).waiting_for == "question"

        with browser_page(web) as page:
            page.goto(f"/runs/{run_id}")
            place = page.locator("li.pending")
            assert place.locator(".question").inner_text() == "Which year?"
            screen(page, "run-question", whole=False)
            place.locator("textarea.answer").fill("2025, the <b>whole</b> year")
            place.locator("button.answer").click()
            page.wait_for_url("**/approvals?said=*")
            assert page.locator("p.said").inner_text() == f"answered the question of run {run_id}"
            page.goto(f"/runs/{run_id}")
            page.wait_for_selector("dd.outcome", timeout=30_000)
            assert "the report" in page.locator("dd.outcome").inner_text()
        assert f.relay.wait(run_id, timeout=30).summary == "the report"
        trace = f.relay.trace(run_id)
        decided = [e.text for e in trace if e.kind == "decided"]
        assert decided == ["question answered by bob", "question answered by alice"]
        last = [c.prompt for c in f.model.calls if "ASK-W:" in c.prompt][-1]
        assert "→ they answered: 2025, the <b>whole</b> year" in last


def _question_seq(f: Fleet, run_id: str) -> int | None:
    asked = [p.seq for p in f.relay.status(run_id).pending if p.kind == "question"]
    return asked[0] if asked else None


@pytest.mark.timeout(180)
def test_a_budget_is_raised_on_the_web_and_the_run_goes_on(tmp_path: Path) -> None:
    with fleet(tmp_path) as f, RelayWeb(f.env, tmp_path / "web.log") as web:
        f.worker("--pool", "threads", "-c", "4")
        f.brain.script("BUDGET-W:", {0: call("read_note", name="a"), 1: final("read it")})
        run_id = f.relay.start("BUDGET-W: read a", budget=Budget(model_calls=1))
        parked = pending_for(f, run_id, "budget")
        form = form_of(web.client.get("/approvals").text, run_id, str(parked.seq))
        for calls, says in (("-3", "more than 0"), ("lots", "not a whole number"), ("", "say")):
            bad = {**form, "decision": "extend", "calls": calls}
            answer = web.client.post("/approvals/decide", data=bad)
            assert (answer.status_code, says in answer.text) == (400, True), answer.text
        # A limit the tree never had: refused, as `relay extend` refuses it.
        tokens = web.client.post(
            "/approvals/decide", data={**form, "decision": "extend", "tokens": "500"}
        )
        assert tokens.status_code == 409
        assert "has no limit of tokens to raise" in tokens.text
        # Still parked where the person saw it: nothing was woken by what was refused.
        still = [p.seq for p in f.relay.status(run_id).pending if p.kind == "budget"]
        assert still == [parked.seq]

        with browser_page(web) as page:
            page.goto("/approvals")
            place = page.locator(f"tr.pending[data-run='{run_id}']")
            fields = place.locator("form.decide-budget input[type=text]")
            # Only the limit the tree has is offered, with what it is now.
            assert [fields.nth(n).get_attribute("name") for n in range(fields.count())] == ["calls"]
            assert fields.first.get_attribute("placeholder") == "now 1"
            page.goto(f"/runs/{run_id}")
            place = page.locator("li.pending")
            assert "the budget: The tree has used 1 model call" in place.inner_text()
            place.locator("input[name=calls]").fill("2")
            screen(page, "run-budget", whole=False)
            place.locator("button.extend").click()
            page.wait_for_url("**/approvals?said=*")
            assert page.locator("p.said").inner_text() == (
                f"raised the budget of run {run_id}'s tree by 2 model calls;"
                f" run {run_id} goes on from step {parked.seq}"
            )
        assert f.relay.wait(run_id, timeout=30).summary == "read it"
        status = f.relay.status(run_id)
        assert status.budget == Budget(model_calls=3)
        assert [e.kind for e in f.relay.trace(run_id)].count("budget_extended") == 1

        # Through the JSON API, for scripts: the same raise, named by the parked step.
        again = f.relay.start("BUDGET-W: read a again", budget=Budget(model_calls=1))
        step = pending_for(f, again, "budget").seq
        api = f"/api/runs/{again}/budget"
        assert web.client.post(api, json={"calls": 0, "step": step}).status_code == 400
        cross = web.client.post(api, json={"calls": 1, "step": step},
                                headers={"Origin": "http://evil"})  # fmt: skip
        assert cross.status_code == 403
        raised = web.client.post(api, json={"calls": 1, "step": step})
        said = raised.json()["done"]  # ("1 model call", however Budget words it)
        assert said.startswith(f"raised the budget of run {again}'s tree by 1 model call")
        assert said.endswith(f"; run {again} goes on from step {step}")
        assert f.relay.wait(again, timeout=30).summary == "read it"


@pytest.mark.timeout(180)
def test_a_parked_budget_is_raised_once_and_only_by_a_raise_that_lifts_it(
    tmp_path: Path,
) -> None:
    with fleet(tmp_path) as f, RelayWeb(f.env, tmp_path / "web.log") as web:
        f.worker("--pool", "threads", "-c", "4")
        f.brain.script("ONCE-W:", {0: call("read_note", name="a"), 1: final("read it")})
        budget = Budget(model_calls=1, tokens=10**9)
        run_id = f.relay.start("ONCE-W: read a", budget=budget)
        step = pending_for(f, run_id, "budget").seq
        api = f"/api/runs/{run_id}/budget"

        # Parked at its model calls, more tokens would not let it go on: each raise of
        # them is refused, saying which limit, and raises nothing, however often sent.
        for _ in range(4):
            tokens = web.client.post(api, json={"tokens": 1_000, "step": step})
            assert tokens.status_code == 409, tokens.text
            error = tokens.json()["error"]
            assert "would still leave it at its limit of model calls" in error, error
            assert "(1 model call of 1 used or held)" in error
        assert f.relay.status(run_id).budget == budget
        assert _budget_waits(f, run_id) == [step]

        # A decision that names no step is a bad request, not "no longer pending".
        for body in ({"calls": 1}, {"calls": 1, "step": "x"}, {"calls": 1, "step": True}):
            nameless = web.client.post(api, json=body)
            assert nameless.status_code == 400, nameless.text
            assert '"step" is required' in nameless.json()["error"]
        unnamed = web.client.post(f"/api/runs/{run_id}/answer", json={"text": "May"})
        assert (unnamed.status_code, '"step" is required' in unnamed.json()["error"]) == (
            400, True
        )  # fmt: skip

        # Six raises of the same wait sent at once (each its own connection): one raises.
        def raise_once(_: int) -> httpx.Response:
            auth = (web.user, web.password)
            with httpx.Client(base_url=web.url, auth=auth, timeout=30) as client:
                return client.post(api, json={"calls": 1, "step": step})

        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(raise_once, range(6)))
        codes = sorted(a.status_code for a in answers)
        assert codes == [200, 409, 409, 409, 409, 409], [a.text for a in answers]
        refused = [a.json()["error"] for a in answers if a.status_code == 409]
        assert all(f"is not parked at its budget at step {step}" in e for e in refused), refused
        assert f.relay.status(run_id).budget == Budget(model_calls=2, tokens=10**9)
        assert f.relay.wait(run_id, timeout=30).summary == "read it"
        again = web.client.post(api, json={"calls": 1, "step": step})
        assert again.status_code == 409
        assert f.relay.status(run_id).budget == Budget(model_calls=2, tokens=10**9)

        # Who raised it, and by what: in the trace, on the run's page and in `relay show`.
        [line] = [e for e in f.relay.trace(run_id) if e.kind == "budget_extended"]
        assert (line.text, line.data) == (
            "1 model call more, by alice", {"by": "alice", "raised": "1 model call"}
        )  # fmt: skip
        page = web.client.get(f"/runs/{run_id}").text
        assert '<td class="text">1 model call more, by alice</td>' in page
        shown = relay("show", run_id, env=clean_env(**f.env))
        assert "✓ the budget was extended: 1 model call more, by alice" in shown.stdout


@pytest.mark.timeout(180)
def test_a_raise_too_small_for_the_next_model_call_is_refused_not_said_to_go_on(
    tmp_path: Path,
) -> None:
    env = {"RELAY_MODEL_MAX_TOKENS": "160"}
    with fleet(tmp_path, extra_env=env) as f, RelayWeb(f.env, tmp_path / "web.log") as web:
        f.worker("--pool", "threads", "-c", "4")
        f.brain.script("SMALL-W:", {0: call("read_note", name="a"), 1: final("read it")})
        # 100 tokens do not admit even the first call: it parks at its tokens.
        run_id = f.relay.start("SMALL-W: read a", budget=Budget(tokens=100))
        step = pending_for(f, run_id, "budget").seq
        [parked] = [e for e in f.relay.trace(run_id) if e.kind == "budget"]
        need = parked.data["need"]  # the prompt's size, and a reply of 160 tokens
        assert parked.data["limit"] == "tokens"
        assert need > 160
        api = f"/api/runs/{run_id}/budget"
        short = need - 100  # what the tree lacks for the call its run parked at

        # One token short: the run would park again at once; refused, with what it needs.
        small = web.client.post(api, json={"tokens": short - 1, "step": step})
        assert small.status_code == 409, small.text
        error = small.json()["error"]
        assert f"(0 tokens of {need - 1:,} used or held" in error, error
        assert f"a model call may need {need:,} tokens" in error
        assert error.endswith("Nothing was raised: it needs at least 1 token more")
        assert f.relay.status(run_id).budget == Budget(tokens=100)
        assert _budget_waits(f, run_id) == [step]
        assert f.model.billed("SMALL-W:") == []

        # Just enough: the call it parked at is made, and the raise says so truly.
        enough = web.client.post(api, json={"tokens": short, "step": step})
        assert enough.status_code == 200, enough.text
        assert enough.json()["done"].endswith(f"run {run_id} goes on from step {step}")
        f.until(lambda: len(f.model.billed("SMALL-W:")) == 1, 30, what="the parked call")
        again = web.client.post(api, json={"tokens": short, "step": step})
        assert again.status_code == 409, again.text
        assert f.relay.status(run_id).budget == Budget(tokens=need)
        f.relay.cancel(run_id)


def _budget_waits(f: Fleet, run_id: str) -> list[int]:
    return [p.seq for p in f.relay.status(run_id).pending if p.kind == "budget"]


@pytest.mark.timeout(180)
def test_no_edit_form_where_an_edit_would_be_refused(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        f.worker("--pool", "threads", "-c", "4")
        run_id = _waiting(f, "NOEDIT-1", call("delete_note", name="old.txt"))
        with RelayWeb(f.env, tmp_path / "bare.log") as bare, browser_page(bare) as page:
            for path in ("/approvals", f"/runs/{run_id}"):
                page.goto(path)
                place = page.locator("[data-what='call-1']").first
                assert place.locator("details.edit").count() == 0, path
                assert place.locator("textarea[name=args]").count() == 0, path
                why = place.locator("p.no-edit").inner_text()
                assert "needs relay web started with the app" in why
                assert "--app" in why
                assert place.locator("button.approve").is_enabled()  # deciding as is works
        with RelayWeb(f.env, tmp_path / "app.log", app=APP) as with_app:
            html = with_app.client.get(f"/runs/{run_id}").text
            assert '<details class="edit">' in html
            assert "no-edit" not in html
        assert f.relay.status(run_id).state == "waiting"
