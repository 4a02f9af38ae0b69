"""relay web, driven in a real headless chromium against real workers: sign in, see a
waiting run, click Approve, see it finish; forged and replayed forms are refused."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent_core import Config
from tests.support.brain import call, final
from tests.support.cli import clean_env, relay
from tests.support.fleet import Fleet, fleet
from tests.support.model_server import Reply
from tests.support.redis_server import free_port
from tests.support.web import RelayWeb, browser_page, form_of
from tests.test_flower import _listening_address
from workers import Relay
from workers.web.auth import FormTokens

FLOWER = "http://127.0.0.1:5555"


def _waiting_run(f: Fleet, marker: str) -> str:
    f.brain.script(marker, {0: call("delete_note", name="old.txt"), 1: final("deleted it")})
    run_id = f.relay.start(f"{marker}: delete the old note")
    f.until(lambda: f.relay.status(run_id).state == "waiting", what="the run to wait")
    return run_id


@pytest.mark.timeout(180)
def test_approve_in_the_browser_and_watch_the_run_finish(tmp_path: Path) -> None:
    with fleet(tmp_path) as f, RelayWeb(f.env, tmp_path / "web.log", flower_url=FLOWER) as web:
        f.worker("--pool", "threads", "-c", "4")
        run_id = _waiting_run(f, "WEB-1")
        with browser_page(web) as page:
            _drive(page, run_id, f.relay)
        assert f.relay.wait(run_id, timeout=30).summary == "deleted it"
        assert f.ledger() == ["delete_note old.txt"]
        approved = [e for e in f.relay.trace(run_id) if e.kind == "approved"]
        assert [(e.call_id, e.text, e.data) for e in approved] == [
            ("call-1", "by alice", {"by": "alice"})
        ]


def _drive(page: Any, run_id: str, runs: Relay) -> None:
    page.goto("/runs")
    row = page.locator(f"tr[data-run='{run_id}']")
    assert "waiting" in row.locator("td.state").inner_text()
    assert "call" in row.locator("td.waiting").inner_text()
    page.goto("/runs?state=finished")
    assert page.locator(f"tr[data-run='{run_id}']").count() == 0
    page.goto("/runs?state=waiting")
    page.click(f"a[href='/runs/{run_id}']")
    assert page.locator("#run-state").inner_text() == "⏸ waiting, waiting for call"
    assert "delete_note" in page.locator("li.pending").inner_text()

    page.goto("/approvals")
    pending = page.locator(f"tr.pending[data-run='{run_id}'][data-what='call-1']")
    assert "delete_note" in pending.inner_text()
    the_form = pending.locator("form").evaluate("form => form.outerHTML")
    pending.locator("button.approve").click()
    page.wait_for_url(re.compile(r"/approvals\?said="))
    assert page.locator("p.said").inner_text() == f"approved call-1 of run {run_id}"
    assert page.locator(f"tr.pending[data-run='{run_id}']").count() == 0

    # The same form sent again (as a second click, or a resent page would): refused.
    page.evaluate("html => document.querySelector('main').insertAdjacentHTML('beforeend', html)",
                  the_form)  # fmt: skip
    page.locator("main > form.decide button.approve").click()
    assert page.locator("p.refused").inner_text() == "this form was used already"

    page.goto(f"/runs/{run_id}")  # the page follows the run until it finishes
    page.wait_for_selector("dd.outcome", timeout=30_000)
    assert page.locator("#run-state").inner_text() == "✓ done"
    assert "deleted it" in page.locator("dd.outcome").inner_text()
    assert page.locator("dd.outcome").get_attribute("class").split()[:3] == [
        "outcome", "ending", "done"
    ]  # fmt: skip
    # Each call links the task that carried it, as its worker recorded it; nothing else.
    links = page.locator("#trace a[title='its Celery task in Flower']")
    hrefs = {links.nth(n).get_attribute("href") for n in range(links.count())}
    tasks = {e.data["task"] for e in runs.trace(run_id) if "task" in e.data}
    assert hrefs == {f"{FLOWER}/task/{task}" for task in tasks}
    assert len(tasks) >= 2  # the model calls' and the tool's (some may share one)


@pytest.mark.timeout(120)
def test_a_forged_or_replayed_form_is_refused(tmp_path: Path) -> None:
    with fleet(tmp_path) as f, RelayWeb(f.env, tmp_path / "web.log") as web:
        f.worker("--pool", "threads", "-c", "4")
        first, second = _waiting_run(f, "FORGE-1"), _waiting_run(f, "FORGE-2")
        page = web.client.get("/approvals").text
        form = {**form_of(page, first, "call-1"), "decision": "approve"}
        other = {**form_of(page, second, "call-1"), "decision": "approve"}
        nonce, expires, mac = form["token"].split(".")
        forged = [
            {**form, "token": f"{nonce}.{expires}.{'0' * len(mac)}"},  # a made-up signature
            {**form, "token": f"{nonce}.{int(expires) + 9_999}.{mac}"},  # a longer life
            {**form, "run": second},  # this form, for another run's call
            {**other, "what": "call-2"},  # another form, for a call it was not made for
            {k: v for k, v in form.items() if k != "token"},
        ]
        for fields in forged:
            answer = web.client.post("/approvals/decide", data=fields)
            assert answer.status_code == 403, (fields, answer.text)
        cross = web.client.post("/approvals/decide", data=form, headers={"Origin": "http://evil"})
        assert cross.status_code == 403
        for site in ("cross-site", "same-site"):  # a browser's word alone, without an Origin
            said = web.client.post("/approvals/decide", data=form, headers={"Sec-Fetch-Site": site})
            assert said.status_code == 403, site
        as_bob = httpx.Client(base_url=web.url, auth=("bob", web.password), timeout=10)
        with as_bob:
            assert as_bob.post("/approvals/decide", data=form).status_code == 401
        assert {f.relay.status(r).state for r in (first, second)} == {"waiting"}

        assert web.client.post("/approvals/decide", data=form).status_code == 303
        replayed = web.client.post("/approvals/decide", data=form)
        assert replayed.status_code == 403
        assert "this form was used already" in replayed.text
        assert f.relay.wait(first, timeout=30).summary == "deleted it"
        assert f.relay.status(second).state == "waiting"
        assert f.ledger() == ["delete_note old.txt"]


def test_a_form_past_its_expiry_is_refused_and_one_within_it_taken_once() -> None:
    used: set[str] = set()

    async def claim(nonce: str, ttl_s: int) -> bool:
        assert ttl_s >= 1
        fresh = nonce not in used
        used.add(nonce)
        return fresh

    tokens = FormTokens(b"k" * 32, claim, ttl_s=600)
    what = ("call", "run1", "call-1")

    def refusal(token: str, now_s: int) -> str:
        return asyncio.run(tokens.refusal(token, "alice", what, now_s=now_s))

    late = tokens.issue("alice", what, now_s=1_000)
    assert refusal(late, 1_601) == "this form is too old; open the page again"
    on_time = tokens.issue("alice", what, now_s=1_000)
    assert refusal(on_time, 1_600) == ""
    assert refusal(on_time, 1_600) == "this form was used already"


def test_every_answer_carries_the_security_headers(tmp_path: Path) -> None:
    with fleet(tmp_path) as f, RelayWeb(f.env, tmp_path / "web.log") as web:
        anonymous = httpx.Client(base_url=web.url, timeout=10)
        with anonymous:
            answers = [anonymous.get("/"), web.client.get("/"), web.client.get("/api/runs")]
        answers.append(web.client.get("/runs/nope"))
        for answer in answers:
            headers = answer.headers
            assert headers["x-frame-options"] == "DENY", answer.url
            assert "frame-ancestors 'none'" in headers["content-security-policy"]
            assert "form-action 'self'" in headers["content-security-policy"]
            assert headers["x-content-type-options"] == "nosniff"
            assert headers["referrer-policy"] == "same-origin"
            assert headers["cache-control"] == "no-store"
        assert [a.status_code for a in answers] == [401, 303, 200, 404]


@pytest.mark.timeout(120)
def test_the_json_api_and_basic_auth(tmp_path: Path) -> None:
    with fleet(tmp_path) as f, RelayWeb(f.env, tmp_path / "web.log") as web:
        f.worker("--pool", "threads", "-c", "4")
        run_id = _waiting_run(f, "API-1")
        assert _listening_address(web.port) == "127.0.0.1"
        anonymous = httpx.Client(base_url=web.url, timeout=10)
        with anonymous:
            for path in ("/", "/runs", f"/runs/{run_id}", "/approvals", "/api/runs", "/metrics"):
                answer = anonymous.get(path)
                assert answer.status_code == 401, path
                assert answer.headers["www-authenticate"].startswith("Basic")
        runs = web.client.get("/api/runs", params={"state": "waiting"}).json()
        assert [(r["id"], r["waiting_for"]) for r in runs] == [(run_id, "call")]
        pending = web.client.get("/api/pending").json()
        assert [(p["run_id"], p["what"], p["tool"]) for p in pending] == [
            (run_id, "call-1", "delete_note")
        ]
        url = f"/api/runs/{run_id}/calls/call-1/decision"
        as_form = web.client.post(url, data={"approve": "true"})
        assert as_form.status_code == 415
        assert f.relay.status(run_id).state == "waiting"
        done = web.client.post(url, json={"approve": False, "reason": "keep it"})
        assert done.json() == {"done": f"denied call-1 of run {run_id}"}
        again = web.client.post(url, json={"approve": True})
        assert again.status_code == 409
        f.relay.wait(run_id, timeout=30)
        assert f.ledger() == []
        declined = [e for e in f.relay.trace(run_id) if e.kind == "declined"]
        assert [(e.text, e.data) for e in declined] == [("keep it", {"by": "alice"})]
        trace = web.client.get(f"/api/runs/{run_id}/trace", params={"after": 0}).json()
        assert trace["state"] == "finished"
        assert trace["next"] == len(trace["entries"]) > 0
        assert web.client.get("/api/runs/nope").status_code == 404


@pytest.mark.timeout(120)
def test_a_plan_is_approved_from_the_approvals_page(tmp_path: Path) -> None:
    with fleet(tmp_path) as f, RelayWeb(f.env, tmp_path / "web.log") as web:
        f.worker("--pool", "threads", "-c", "4")
        script = {0: call("read_note", name="a.txt"), 1: final("read it")}
        f.brain.script("PLAN-1", script, plan=["Read a.txt.", "Say so."])
        run_id = f.relay.start("PLAN-1: read a note", config=Config(require_plan=True))
        f.until(lambda: f.relay.status(run_id).waiting_for == "plan", what="the plan")
        page = web.client.get("/approvals").text
        assert "Read a.txt." in page
        (pending,) = f.relay.pending()
        form = {**form_of(page, run_id, str(pending.seq)), "decision": "approve"}
        assert form["kind"] == "plan"
        done = web.client.post("/approvals/decide", data=form)
        assert done.status_code == 303
        said = web.client.get(done.headers["location"]).text
        assert f"approved the plan of run {run_id}" in said
        spoofed = web.client.get("/approvals", params={"said": "approved everything"}).text
        assert "approved everything" not in spoofed
        assert f.relay.wait(run_id, timeout=30).summary == "read it"
        decided = [e.text for e in f.relay.trace(run_id) if e.kind == "decided"]
        assert decided == ["plan approved by alice"]


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({}, "refusing to start relay web without credentials"),
        ({"RELAY_WEB_USER": "alice"}, "set both RELAY_WEB_USER and RELAY_WEB_PASSWORD"),
        ({"RELAY_WEB_PASSWORD": "pw"}, "set both RELAY_WEB_USER and RELAY_WEB_PASSWORD"),
        ({"RELAY_WEB_USER": "alice", "RELAY_WEB_PASSWORD": " "}, "RELAY_WEB_PASSWORD is blank"),
        (
            {"RELAY_WEB_USER": "alice", "RELAY_WEB_PASSWORD": "short"},
            "RELAY_WEB_PASSWORD is shorter than 8 characters",
        ),
    ],
)
def test_relay_web_refuses_to_start_without_credentials(given: dict[str, str], says: str) -> None:
    done = relay("web", "--port", str(free_port()), env=clean_env(**given))
    assert done.returncode == 1
    assert done.stderr.strip().startswith(f"relay: {says}")
    assert "Uvicorn running" not in done.stderr


STREAMED = "Alpha beta gamma: the \u201cfigures\u201d add up to 1,234.50 \u20ac.\nDone."


@pytest.mark.timeout(120)
def test_a_run_page_shows_the_answer_while_it_is_written(tmp_path: Path) -> None:
    with fleet(tmp_path) as f, RelayWeb(f.env, tmp_path / "web.log") as web:
        f.worker("--pool", "threads", "-c", "4")
        # Two characters an event, 150 ms apart: about 6 s of writing.
        f.brain.script("LIVE-1:", {0: Reply(final(STREAMED), piece_chars=2, gap=0.15)})
        run_id = f.relay.start("LIVE-1: add the figures up")
        with browser_page(web) as page:
            page.goto(f"/runs/{run_id}")
            page.wait_for_function(
                "() => document.getElementById('live').textContent.startsWith("
                "'Alpha beta gamma: the \u201cfigures\u201d')",
                timeout=20_000,
            )
            # Shown while the model is still writing: decoded, not the raw JSON.
            assert f.relay.status(run_id).state != "finished"
            assert not page.locator("#live").inner_text().startswith("{")
            assert page.locator("#live-run").inner_text() == run_id
            page.wait_for_selector("dd.outcome", timeout=30_000)
        live = web.client.get(f"/api/runs/{run_id}/live", params={"after": "0"}).json()
        kinds = [e["kind"] for e in live["events"]]
        assert (kinds[0], kinds[-1]) == ("step", "done")
        assert "".join(e["text"] for e in live["events"] if e["kind"] == "text") == final(STREAMED)
        assert live["next"] == live["events"][-1]["id"]
        later = web.client.get(f"/api/runs/{run_id}/live", params={"after": live["next"]})
        assert later.json() == {"next": live["next"], "events": []}
        bad = web.client.get(f"/api/runs/{run_id}/live", params={"after": "x; DROP"})
        assert bad.status_code == 400
        assert web.client.get("/api/runs/nope/live").status_code == 404

        # A run parked for a person writes nothing now: its last reply (streamed, in the
        # live stream still) is not shown as "being written".
        f.brain.script("LIVE-2:", {0: Reply(call("delete_note", name="x"), piece_chars=4)})
        parked = f.relay.start("LIVE-2: delete x")
        f.until(lambda: f.relay.status(parked).state == "waiting", what="the run to park")
        streamed = web.client.get(f"/api/runs/{parked}/live", params={"after": "0"}).json()
        assert any(e["kind"] == "text" for e in streamed["events"])  # there is text to show
        with browser_page(web) as page:
            page.goto(f"/runs/{parked}")
            page.wait_for_timeout(2_500)  # three polls of the live stream
            assert page.locator("#live-box").is_hidden()


LATER = "The second answer, written after a tool ran."

# Every text the "Being written" box shows while it is visible, from the page's first
# paint on, kept in the tab's sessionStorage (a reload, once the run ends, keeps it).
RECORD_LIVE = """document.addEventListener('DOMContentLoaded', () => {
  const box = document.getElementById('live-box');
  const live = document.getElementById('live');
  if (!box) return;
  const seen = () => {
    if (box.hidden) return;
    const shown = JSON.parse(sessionStorage.getItem('shownLive') || '[]');
    shown.push(live.textContent);
    sessionStorage.setItem('shownLive', JSON.stringify(shown));
  };
  new MutationObserver(seen).observe(box, {
    subtree: true, childList: true, characterData: true, attributes: true,
  });
});"""
SHOWN_LIVE = "() => JSON.parse(sessionStorage.getItem('shownLive') || '[]')"


@pytest.mark.timeout(180)
def test_the_live_page_counts_tokens_and_age_and_never_shows_a_reply_as_json(
    tmp_path: Path,
) -> None:
    with fleet(tmp_path) as f, RelayWeb(f.env, tmp_path / "web.log") as web:
        f.worker("--pool", "threads", "-c", "4")
        # A tool call, streamed; then the next reply starts 3 s late (the page still holds
        # the tool call's text) and is written over about 3 s.
        f.brain.script("LIVE-3:", {
            0: Reply(call("read_note", name="a"), piece_chars=4, gap=0.05, delay=3),
            1: Reply(final(LATER), piece_chars=2, gap=0.1, delay=3),
        })  # fmt: skip
        with browser_page(web) as page:  # (the browser first: the page opens as it starts)
            run_id = f.relay.start("LIVE-3: read a, then say so")
            page.add_init_script(RECORD_LIVE)
            page.goto(f"/runs/{run_id}")
            page.evaluate("window.notReloaded = true")
            tokens = page.locator("#run-tokens").inner_text()
            age = page.locator("#run-age").inner_text()
            # Both change on the page as it is, from its poll: the page is not reloaded.
            page.wait_for_function(
                "t => document.getElementById('run-tokens').textContent !== t", arg=tokens,
                timeout=20_000,
            )  # fmt: skip
            page.wait_for_function(
                "a => document.getElementById('run-age').textContent !== a", arg=age,
                timeout=20_000,
            )  # fmt: skip
            assert page.evaluate("window.notReloaded") is True
            assert f.relay.status(run_id).state == "running"
            # (The whole answer may be replaced by the outcome before a poll shows it.)
            page.wait_for_function(f"() => ({SHOWN_LIVE})().some(t => t.length >= 12)",
                                   timeout=30_000)  # fmt: skip
            page.wait_for_selector("dd.outcome", timeout=30_000)
            shown = page.evaluate(SHOWN_LIVE)
            done = f.relay.status(run_id).total_usage.total_tokens
            assert page.locator("#run-tokens").inner_text().startswith(f"{done:,} (")
        assert f.relay.wait(run_id, timeout=30).summary == LATER
        # Only the answer, as far as it had come, was ever shown: never a reply's JSON.
        json_like = [text for text in shown if "{" in text or '"tool"' in text]
        assert json_like == []
        assert all(LATER.startswith(text) for text in shown), shown


ODD = [
    "²",
    "٣",
    "-1",
    "1e3",
    "99999999999999999999",
    "18446744073709551616-0",
    "0-²",
    " 1",
    "é",
    "%00",
]


@pytest.mark.timeout(120)
def test_bad_input_from_a_signed_in_user_is_a_4xx_with_a_line(tmp_path: Path) -> None:
    with fleet(tmp_path) as f, RelayWeb(f.env, tmp_path / "web.log") as web:
        f.worker("--pool", "threads", "-c", "4")
        run_id = _waiting_run(f, "ODD-1")
        page = web.client.get("/approvals").text
        form = {**form_of(page, run_id, "call-1"), "decision": "approve"}
        nonce, expires, mac = form["token"].split(".")
        for token in (f"{nonce}.{expires}.{mac[:-1]}é", f"{nonce}.²²².{mac}", "é.é.é"):
            answer = web.client.post("/approvals/decide", data={**form, "token": token})
            assert answer.status_code == 403, (token, answer.status_code)
            assert "this form" in answer.text
        for value in ODD:
            for path, name in (
                ("/api/runs", "limit"),
                ("/api/runs", "state"),
                ("/api/runs", "before"),
                (f"/api/runs/{run_id}/trace", "after"),
                (f"/api/runs/{run_id}/live", "after"),
            ):
                answer = web.client.get(path, params={name: value})
                assert answer.status_code == 400, (path, value, answer.status_code)
                assert answer.json()["error"]
            for path in ("/approvals", f"/runs/{run_id}"):
                params = {"state": value, "said": value, "sig": value}
                assert web.client.get(path, params=params).status_code == 200, (path, value)
            for name in ("state", "before"):  # a list of no state, or from no cursor
                answer = web.client.get("/runs", params={name: value})
                assert answer.status_code == 400, (name, value)
                assert "state" in answer.text or "cursor" in answer.text
        biggest = f"{2**64 - 1}-{2**64 - 1}"
        assert web.client.get(f"/api/runs/{run_id}/live", params={"after": biggest}).json() == {
            "next": biggest,
            "events": [],
        }
        assert f.relay.status(run_id).state == "waiting"  # nothing of it was decided
