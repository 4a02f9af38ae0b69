"""The screens tell the truth: a truth table of outcome x screen. Runs that end every way
a run can end, each looked at on the runs list (its label, mark and colour), through
the filters that must find it and those that must not, on its run page, through the
JSON API, `relay runs --state` and the metrics. Real workers, Redis, `relay web` and
chromium. With RELAY_TEST_SCREENS=DIR, each page is also saved there as a picture
(docs/screens/ holds the ones taken so)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent_core import Config
from tests.support.brain import call, final
from tests.support.cli import clean_env, relay
from tests.support.fleet import Fleet, fleet
from tests.support.model_server import Reply
from tests.support.web import RelayWeb, browser_page, screen
from workers import Budget

APP = "tests.apps.notes:relay"
LISTS = ("running", "waiting", "done", "failed", "cancelled", "declined")


@dataclass(frozen=True)
class Outcome:
    """One row of the truth table: how a run is made to end, and how it must look."""

    marker: str
    listed: str
    """The list it must be on (done, failed, cancelled, declined)."""
    label: str
    """What the list says of it, besides the list's name."""
    unknown: int = 0


def _config(**changes: int) -> Config:
    return Config(require_plan=False, **changes)  # type: ignore[arg-type]


def _start(f: Fleet) -> dict[str, Outcome]:
    """Start one run for each way a run can end; return them by run id once all ended."""
    script = f.brain.script
    started: dict[str, Outcome] = {}

    def begin(outcome: Outcome, run: Callable[[], str]) -> None:
        started[run()] = outcome

    script("TT-DONE:", {0: final("all good")})
    begin(Outcome("TT-DONE", "done", ""), lambda: f.relay.start("TT-DONE: do it"))
    script("TT-500:", {0: Reply(status=500, text="upstream exploded")})
    begin(Outcome("TT-500", "failed", "the model call failed"),
          lambda: f.relay.start("TT-500: ask"))  # fmt: skip
    script("TT-BAD:", {n: "this is not the JSON object asked for" for n in range(6)})
    begin(Outcome("TT-BAD", "failed", "too many unusable replies"),
          lambda: f.relay.start("TT-BAD: ask", config=_config(max_retries=1)))  # fmt: skip
    script("TT-LOOP:", {n: call("read_note", name="same.txt") for n in range(12)})
    begin(Outcome("TT-LOOP", "failed", "no progress"),
          lambda: f.relay.start("TT-LOOP: read", config=_config(max_repeats=2)))  # fmt: skip
    script("TT-LIMIT:", {0: call("read_note", name="a"), 1: call("read_note", name="b"),
                         2: final("never")})  # fmt: skip
    begin(Outcome("TT-LIMIT", "failed", "call limit reached"),
          lambda: f.relay.start("TT-LIMIT: read two", config=_config(max_calls=1)))  # fmt: skip
    script("TT-BUDGET:", {0: call("pay", amount=5), 1: final("paid")})
    begin(Outcome("TT-BUDGET", "failed", "budget exceeded"),
          lambda: f.relay.start("TT-BUDGET: pay", budget=Budget(seconds=2)))  # fmt: skip
    script("TT-UNSURE:", {0: call("unsure", amount=3), 1: final("sent, maybe")})
    begin(Outcome("TT-UNSURE", "done", "", unknown=1), lambda: f.relay.start("TT-UNSURE: send"))
    script("TT-CANCEL:", {0: call("delete_note", name="x"), 1: final("never")})
    cancelled = f.relay.start("TT-CANCEL: delete")
    started[cancelled] = Outcome("TT-CANCEL", "cancelled", "cancelled")
    script("TT-PLAN:", {0: call("write_note", name="n.txt", text="no")})
    declined = f.relay.start("TT-PLAN: write", config=Config(require_plan=True))
    started[declined] = Outcome("TT-PLAN", "declined", "plan declined")

    f.until(lambda: f.relay.status(cancelled).state == "waiting", what="TT-CANCEL to wait")
    assert f.relay.cancel(cancelled, "changed my mind")
    f.until(lambda: f.relay.status(declined).state == "waiting", what="TT-PLAN to wait")
    f.relay.approve_plan(declined, yes=False)
    for run_id in started:
        f.relay.wait(run_id, timeout=60)
    return started


def _cells(page: Any, run_id: str) -> tuple[str, list[str], str]:
    """A run's row on the list shown: its state cell's text, its classes, its colour."""
    row = page.locator(f"tr[data-run='{run_id}']")
    state = row.locator("td.state")
    colour = state.evaluate("cell => getComputedStyle(cell).color")
    return state.inner_text(), (row.get_attribute("class") or "").split(), colour


@pytest.mark.timeout(420)
def test_every_outcome_on_every_screen(tmp_path: Path) -> None:
    env = {"RELAY_MODEL_RETRIES": "0", "RELAY_TICK_SECONDS": "1"}
    with fleet(tmp_path, extra_env=env) as f, RelayWeb(f.env, tmp_path / "web.log", app=APP) as web:
        f.worker("--pool", "threads", "-c", "8")
        runs = _start(f)
        for run_id, outcome in runs.items():
            status = f.relay.status(run_id)
            assert (status.ending, status.unknown_calls) == (outcome.listed, outcome.unknown), (
                outcome, status.outcome, f.logs()[-3000:],
            )  # fmt: skip

        with browser_page(web) as page:
            page.set_viewport_size({"width": 1400, "height": 900})
            page.goto("/runs")
            screen(page, "runs")
            colours: dict[str, set[str]] = {}
            for run_id, outcome in runs.items():
                text, classes, colour = _cells(page, run_id)
                assert outcome.listed in classes, (outcome, classes)
                assert text.split()[1] == outcome.listed, (outcome, text)  # mark, then list
                assert outcome.label in text, (outcome, text)
                assert ("unknown" in classes) == bool(outcome.unknown), (outcome, classes)
                colours.setdefault(outcome.listed, set()).add(colour)
            # One colour a list, and no two lists share one: failed never looks done.
            assert all(len(found) == 1 for found in colours.values()), colours
            assert len({c for found in colours.values() for c in found}) == len(colours)
            marks = {page.locator(f"tr[data-run='{r}'] .mark").inner_text() for r in runs}
            assert len(marks) == 4  # done, failed, cancelled, declined: a mark each

            for which in (*LISTS, "finished"):
                page.goto(f"/runs?state={which}")
                if which == "failed":
                    screen(page, "runs-failed")
                shown = {r for r in runs if page.locator(f"tr[data-run='{r}']").count()}
                wanted = {r for r, o in runs.items() if which in (o.listed, "finished")}
                assert shown == wanted, (which, shown, wanted)
                api = web.client.get("/api/runs", params={"state": which, "limit": 100})
                assert {row["id"] for row in api.json()} & set(runs) == wanted, which
                assert int(api.headers["X-Total-Count"]) == len(wanted), which

            for run_id, outcome in runs.items():
                page.goto(f"/runs/{run_id}")
                box = page.locator("#run-outcome")
                assert outcome.listed in (box.get_attribute("class") or "").split(), outcome
                assert box.inner_text().split()[1] == f"{outcome.listed}:", outcome
                assert page.locator("dd.flag").count() == (1 if outcome.unknown else 0)
                if outcome.marker == "TT-500":  # the failed call's own line, who made it
                    made = page.locator("#trace tr.call_failed .made").inner_text()
                    assert "attempt 1 on w0@test" in made, made
                if outcome.marker in ("TT-500", "TT-UNSURE"):
                    screen(page, f"run-{outcome.marker.lower()}")
            page.goto("/schedules")
            assert "No schedules" in page.locator("#schedules").inner_text()
            page.goto("/routes")
            assert (
                page.locator("tr[data-route='default'] td.circuit")
                .inner_text()
                .startswith("closed")
            )
            protocol = page.locator("tr[data-route='default'] td.protocol").inner_text()
            assert protocol == "text", protocol
            screen(page, "routes")

        # The command line, through the same lists.
        for which in ("failed", "done", "declined"):
            listed = relay("runs", "--state", which, "--json", env=clean_env(**f.env))
            assert listed.returncode == 0, listed.stderr
            ids = {row["id"] for row in json.loads(listed.stdout)}
            assert ids == {r for r, o in runs.items() if o.listed == which}, which

        # The metrics: every finished run by how it ended.
        metrics = web.client.get("/metrics").text
        counted = {
            sample.labels["outcome"]: sample.value
            for family in text_string_to_metric_families(metrics)
            for sample in family.samples
            if sample.name == "relay_runs" and sample.labels["state"] == "finished"
        }
        expected = {which: float(sum(o.listed == which for o in runs.values()))
                    for which in ("done", "failed", "cancelled", "declined")}  # fmt: skip
        assert counted == expected


@pytest.mark.timeout(300)
def test_waiting_runs_stay_on_the_waiting_list_behind_many_newer_ones(tmp_path: Path) -> None:
    with fleet(tmp_path) as f, RelayWeb(f.env, tmp_path / "web.log", app=APP) as web:
        f.worker("--pool", "threads", "-c", "8")
        f.brain.script("PARK-", {0: call("delete_note", name="x"), 1: final("deleted")})
        parked = [f.relay.start(f"PARK-{n:02}: delete") for n in range(20)]
        f.until(lambda: all(f.relay.status(r).state == "waiting" for r in parked), 60,
                what="20 runs to park")  # fmt: skip
        f.brain.script("FILL-", {0: final("quick")})
        newer = [f.relay.start(f"FILL-{n:03}: answer") for n in range(600)]
        for run_id in newer:
            assert f.relay.wait(run_id, timeout=120).summary == "quick"
        api = web.client.get("/api/runs", params={"state": "waiting", "limit": 20})
        assert sorted(row["id"] for row in api.json()) == sorted(parked)
        assert api.headers["X-Total-Count"] == "20"
        # Newest first: by creation ms, then by id (runs started in one ms tie on time).
        created = {r: f.relay.status(r).created_ms for r in parked}
        newest = sorted(parked, key=lambda r: (created[r], r), reverse=True)
        one = web.client.get("/api/runs", params={"state": "waiting", "limit": 1})
        assert [row["id"] for row in one.json()] == [newest[0]]
        follow = one.headers["Link"]
        assert follow.endswith('>; rel="next"')
        second = web.client.get(follow[1 : follow.index(">")])
        assert [row["id"] for row in second.json()] == [newest[1]]
        page = web.client.get("/runs", params={"state": "waiting"}).text
        assert all(f"data-run='{r}'" in page or f'data-run="{r}"' in page for r in parked)
        assert "Showing 20 of 20 waiting runs" in page
