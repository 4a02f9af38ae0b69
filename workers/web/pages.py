"""The HTML pages of relay web: the runs, one run, and what waits on a person.

GET  /runs?state=failed&before=CURSOR   the runs, a page at a time (state or how it ended,
                             waiting for, age, key, tokens, cost)
GET  /runs/<id>              one run: task, plan, outcome, usage, specialists, live trace
GET  /approvals              plans, calls, questions and budgets waiting, whole: Approve
                             (as is, or edited, where this app's tool can check the
                             edit) and Deny (with a reason), Answer, Raise the budget
GET  /schedules              the schedules, when they fire next, their latest runs
GET  /schedules/{name}       one schedule: how it runs unattended, and its firing history
GET  /routes                 the model routes as the fleet shares them
GET  /diff?a=RUN&b=RUN       two runs step by step (a fork and its original, say)
POST /approvals/decide       one decision, answer or raise (or a run's Cancel), from a
                             form made for this person and what it decides
POST /runs/fork              a fork of a run from one of its steps (route, stubbed tools),
                             from a form made for this person and step
"""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import parse_qs, quote, urlencode

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from scheduler.history import HISTORY_MAX, FiringKind
from scheduler.schedules import Schedule, local_iso
from scheduler.store import Notification
from workers.engine.records import RUN_FILTERS
from workers.errors import DecisionRefused, RelayError, RunNotFound
from workers.settings import now_ms
from workers.store import reads
from workers.web.auth import cross_site, same_text
from workers.web.site import Web
from workers.web.views import (
    LONG_ARGS_CHARS,
    args_digest,
    args_text,
    budget_limits,
    budget_raise,
    cost_of,
    journal_rows,
    money,
    pending_row,
    run_row,
    run_tree,
    runs_page,
    trace_row,
)

__all__ = ["routes"]

PAGE_RUNS = 100
SCHEDULE_RUNS_READ = 500
"""The newest runs the schedules page looks through for each schedule's firings."""
FIRINGS_SHOWN = 5
HISTORY_SHOWN = 100
"""Entries of a schedule's history its page shows, the newest."""
MAX_ANSWER_CHARS = 20_000
"""An answer to a question, from the form, at most (what `relay answer` keeps)."""
MAX_FORM_BYTES = 262_144
"""A decision's form, edited arguments included."""
MAX_FORK_TASK_CHARS = 10_000
"""A new request a fork begins with, from the form, at most."""
FormRow = tuple[dict[str, Any], str]
"""Something that waits on a person, as a page shows it, and the token of its form."""
STEPS_SHOWN = 200
"""The newest journal steps a run's page offers to fork from."""


class _Pages:
    def __init__(self, web: Web) -> None:
        self.web = web

    async def home(self, _: Request) -> Response:
        return RedirectResponse("/runs", status_code=303)

    async def runs(self, request: Request) -> Response:
        web = self.web
        state = request.query_params.get("state", "")
        before = request.query_params.get("before", "")
        try:
            page = await runs_page(web.arelay, state, PAGE_RUNS, before, now_ms())
        except ValueError as error:
            return web.page(request, "missing.html", 400, heading="Bad request", message=str(error))
        # A run's tokens and cost include its specialists': a tree counts once, on its
        # top run on this page.
        tops = [row for row in page.rows if row["depth"] == 0]
        priced = [row["cost_micro"] for row in tops if row["cost_micro"] is not None]
        by_key: dict[str, list[int]] = {}
        for row in tops:
            spent = by_key.setdefault(str(row["key"] or ""), [0, 0, 0])
            spent[0] += 1
            spent[1] += row["tokens"]
            spent[2] += row["cost_micro"] or 0
        keys = [(key, n, tokens, money(cost)) for key, (n, tokens, cost) in sorted(by_key.items())]
        return web.page(
            request,
            "runs.html",
            page=page,
            runs=page.rows,
            state=state,
            states=RUN_FILTERS,
            page_tokens=sum(row["tokens"] for row in tops),
            page_cost=money(sum(priced)) if priced else "",
            by_key=keys,
        )

    async def run(self, request: Request) -> Response:
        web, relay = self.web, self.web.arelay
        run_id = request.path_params["run_id"]
        now = now_ms()
        try:
            tree = await run_tree(relay, await relay.status(run_id), now)
            position, entries = await relay.drive(reads.trace(relay.keys, run_id))
        except RunNotFound as error:
            return web.page(request, "missing.html", 404, message=str(error))
        plans = [entry.text for entry in entries if entry.kind == "plan"]
        trace = [trace_row(entry, web.settings.flower_url) for entry in entries]
        user = web.user(request)
        pending = await _forms(web, user, tree["pending"])
        said = _said(web, request)
        stop = {"kind": "cancel", "run_id": run_id, "what": "run"}
        cancel = (stop, web.form_token(user, stop)) if tree["state"] != "finished" else None
        plan = [step.strip() for step in plans[-1].splitlines() if step.strip()] if plans else []
        forks = web.relay.kit.any_tools()  # replaying a run needs the app's tools
        journal = await relay.drive(reads.journal_tail(relay.keys, run_id, STEPS_SHOWN))
        steps = [
            (row, _fork_token(web, user, run_id, row["step"]) if forks else "")
            for row in journal_rows(*journal, ending=_ending(tree))
        ]
        return web.page(
            request,
            "run.html",
            run=tree,
            fired_at=await run_in_threadpool(_fired_at, web, tree) if tree["schedule"] else "",
            trace=trace,
            after=position,
            plan=plan,
            pending=pending,
            cancel=cancel,
            said=said,
            steps=steps,
            routes=[route.name for route in web.relay.routes],
        )

    async def diff(self, request: Request) -> Response:
        web = self.web
        a, b = request.query_params.get("a", ""), request.query_params.get("b", "")
        try:
            found = await run_in_threadpool(web.relay.diff, a, b)
        except RelayError as error:
            return web.page(request, "missing.html", 404, message=str(error))
        return web.page(request, "diff.html", diff=found, cost=cost_of)

    async def fork(self, request: Request) -> Response:
        web = self.web
        form = await _posted(web, request, "a fork")
        if isinstance(form, Response):
            return form
        run_id, what = form.get("run", ""), form.get("what", "")
        user = web.user(request)
        why = await _form_refused(web, form, user, ("fork", run_id, what))
        if why:
            return _refused(web, request, why)
        route = form.get("route") or None
        stub = form.get("stub") == "1"
        task = form.get("task", "").strip()[:MAX_FORK_TASK_CHARS] or None
        try:
            new_id = await run_in_threadpool(
                lambda: web.relay.fork(run_id, int(what), route=route, stub_tools=stub, task=task)
            )
        except (RelayError, ValueError) as error:
            return _refused(web, request, str(error), status=409)
        said = f"forked run {run_id} at step {what} by {user}: run {new_id}"
        query = urlencode({"said": said, "sig": web.signed(said)})
        return RedirectResponse(f"/runs/{quote(new_id, safe='')}?{query}", status_code=303)

    async def schedules(self, request: Request) -> Response:
        web, now = self.web, now_ms()
        fired: dict[str, list[dict[str, Any]]] = {}
        for status in await web.arelay.runs(limit=SCHEDULE_RUNS_READ):
            if status.schedule and len(fired.setdefault(status.schedule, [])) < FIRINGS_SHOWN:
                fired[status.schedule].append(run_row(status, now))
        found_schedules, notes, lasts = await run_in_threadpool(_schedules_and_notes, web)
        rows = [
            {
                "name": found.name,
                "describe": found.describe(),
                "mode": found.mode,
                "next": found.next_text(),
                "last_ms": last[0],
                "never": last[1],
                "task": found.task(),
                "runs": fired.get(found.name, []),
            }
            for found, last in zip(found_schedules, lasts, strict=True)
        ]
        return web.page(request, "schedules.html", schedules=rows, notifications=notes)

    def schedule(self, request: Request) -> Response:
        web, name = self.web, request.path_params["name"]
        found = web.relay.scheduling.get(name)
        if found is None:
            return web.page(request, "missing.html", 404, message=f"no schedule named {name!r}")
        history = [
            {
                "at": found.local_time(view.firing.slot_ms),
                "kind": view.firing.kind,
                "source": view.firing.source,
                "run_id": view.firing.run_id if view.firing.kind == "fired" else None,
                "outcome": view.stop or view.state or "",
                "why": view.firing.why,
            }
            for view in web.relay.scheduling.history(name, HISTORY_SHOWN)
        ]
        facts = {
            "when": found.describe(),
            "time zone": found.time_zone,
            "next": found.next_text(),
            "overlap": found.overlap,
            "plan": "approved by the schedule" if found.approve_plan else "asks a person",
            "when a run would wait": found.on_wait,
            "calls that ask": "the app's policy" if found.ask is None else ", ".join(found.ask),
            **({"paused": found.pause_note or "yes"} if found.paused else {}),
            "task": found.task(),
        }
        return web.page(request, "schedule.html", schedule=name, facts=facts, history=history)

    def routes(self, request: Request) -> Response:
        return web_routes(self.web, request)

    async def approvals(self, request: Request) -> Response:
        web = self.web
        user, now = web.user(request), now_ms()
        rows = [pending_row(p, now) for p in await web.arelay.pending()]
        forms = await _forms(web, user, rows)
        tasks = await _tasks(web, {str(row["run_id"]) for row in rows})
        said = _said(web, request)
        return web.page(request, "approvals.html", pending=forms, said=said, tasks=tasks)

    async def decide(self, request: Request) -> Response:
        web = self.web
        form = await _posted(web, request, "a decision")
        if isinstance(form, Response):
            return form
        kind, run_id, what = form.get("kind", ""), form.get("run", ""), form.get("what", "")
        decision = form.get("decision", "")
        yes = decision in ("approve", "approve_edited")
        edited = _edited(form.get("args", "")) if decision == "approve_edited" else None
        more = budget_raise(form) if kind == "budget" else None
        answer = form.get("answer", "").strip()[:MAX_ANSWER_CHARS]
        # A form to mend is refused before its token is used: send it again, mended.
        if isinstance(edited, str) or isinstance(more, str):
            return _refused(web, request, str(edited if isinstance(edited, str) else more), 400)
        if kind == "question" and not answer:
            return _refused(web, request, "write the answer: the run goes on with it", 400)
        user = web.user(request)
        why = await _form_refused(web, form, user, (kind, run_id, what))
        if why:
            return _refused(web, request, why)
        reason = answer if kind == "question" else form.get("reason", "").strip()[:2_000]
        try:
            if yes and kind == "call" and edited is None:
                await _whole_call_seen(web, run_id, what, form.get("seen", ""))
            said = await web.decide(
                user, kind, run_id, what, yes=yes, reason=reason, args=edited, more=more
            )
        except (DecisionRefused, RunNotFound) as error:
            return _refused(web, request, str(error), status=409)
        query = urlencode({"said": said, "sig": web.signed(said)})
        back = f"/runs/{quote(run_id, safe='')}" if kind == "cancel" else "/approvals"
        return RedirectResponse(f"{back}?{query}", status_code=303)


def routes(web: Web) -> list[Route]:
    """The pages' routes, on `web`."""
    pages = _Pages(web)
    return [
        Route("/", pages.home),
        Route("/runs", pages.runs),
        Route("/runs/{run_id}", pages.run),
        Route("/approvals", pages.approvals),
        Route("/schedules", pages.schedules),
        Route("/schedules/{name}", pages.schedule),
        Route("/routes", pages.routes),
        Route("/approvals/decide", pages.decide, methods=["POST"]),
        Route("/diff", pages.diff),
        Route("/runs/fork", pages.fork, methods=["POST"]),
    ]


async def _forms(web: Web, user: str, rows: list[dict[str, Any]]) -> list[FormRow]:
    """Each of `rows` (what waits on a person) with the token of the form that decides it,
    and what its form needs: whether a call's arguments can be edited here (`edit_note`
    says why not), the limits a parked tree's budget form can raise."""
    notes: dict[str, str] = {}
    budgets: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        if row["kind"] == "call":
            tool = str(row["tool"])
            if tool not in notes:
                notes[tool] = await _edit_note(web, tool)
            row["edit_note"] = notes[tool]
        elif row["kind"] == "budget":
            root = str(row["root_id"])
            if root not in budgets:
                try:
                    budgets[root] = budget_limits((await web.arelay.status(root)).budget)
                except RunNotFound:
                    budgets[root] = []
            row["limits"] = budgets[root]
    return [(row, web.form_token(user, row)) for row in rows]


async def _edit_note(web: Web, tool: str) -> str:
    """Why a call of `tool` cannot be approved with edited arguments from this relay web
    ("" if it can): the app's own tool checks them, so an edit form is shown only where
    that tool is known (with no app, any edit would be refused)."""
    kit = web.relay.kit
    if not kit.any_tools():
        return (
            "Editing the arguments needs relay web started with the app that runs this"
            " tool (relay --app MODULE:ATTR web): its tool checks the edited arguments."
        )
    # A tool still to be listed may start an MCP server: that waits on a thread.
    found = kit.spec(tool) if kit.listed() else await run_in_threadpool(kit.spec, tool)
    if found is None:
        return (
            f"This app has no tool {tool!r} to check edited arguments against: edit them"
            " from a relay web started with the app that runs it (--app)."
        )
    return ""


def web_routes(web: Web, request: Request) -> Response:
    """The model routes as the fleet shares them (what `relay routes` shows)."""
    now = now_ms()
    rows = [
        {
            **state.model_dump(),
            "paused_s": max(0, (state.paused_until_ms or 0) - now) / 1000,
            "probe_s": max(0, (state.next_probe_ms or 0) - now) / 1000,
        }
        for state in web.relay.route_states()
    ]
    return web.page(request, "routes.html", routes=rows)


async def _posted(web: Web, request: Request, doing: str) -> dict[str, str] | Response:
    """The fields of a form posted to this server (each field's first value), or the
    refusal of one sent from another site or too large."""
    if cross_site(request.headers):
        return _refused(web, request, f"{doing} from another site is refused")
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        return _refused(web, request, "the form is too large")
    return {k: v[0] for k, v in parse_qs(body.decode(errors="replace")).items() if v}


async def _form_refused(
    web: Web, form: dict[str, str], user: str, what: tuple[str, str, str]
) -> str:
    """Why the form's token is refused for `user` and `what` ("" if not: it is used now)."""
    token = form.get("token", "")
    return await web.tokens.refusal(token, user, what, int(time.time()))


def _ending(tree: dict[str, Any]) -> str | None:
    """How a finished run ended, as its last journal step says it (None: not finished)."""
    outcome = tree["outcome"]
    return str(outcome["label"]) if tree["state"] == "finished" and outcome else None


def _fork_token(web: Web, user: str, run_id: str, step: int) -> str:
    return web.form_token(user, {"kind": "fork", "run_id": run_id, "what": str(step)})


def _said(web: Web, request: Request) -> str:
    """What this server said after a decision (`said`, signed by it): none from a link
    someone else made."""
    said = request.query_params.get("said", "")
    return said if same_text(request.query_params.get("sig", ""), web.signed(said)) else ""


async def _tasks(web: Web, runs: set[str]) -> dict[str, str]:
    """The task of each of `runs` (those still there)."""
    found = {}
    for run_id in sorted(runs)[:500]:
        try:
            found[run_id] = (await web.arelay.status(run_id)).task
        except RunNotFound:
            continue
    return found


def _edited(text: str) -> dict[str, Any] | str:
    """The edited arguments a form sent (a JSON object), or why they are no arguments."""
    try:
        args = json.loads(text)
    except ValueError as error:
        return f"the edited arguments are not JSON: {error}"
    if not isinstance(args, dict):
        return "the edited arguments must be a JSON object, {...}"
    return args


async def _whole_call_seen(web: Web, run_id: str, call_id: str, seen: str) -> None:
    """Refuse an approval of a call too long to show whole unless the page it came from
    had its whole arguments opened (the page sends their digest back only then)."""
    pending = [p for p in (await web.arelay.status(run_id)).pending if p.call_id == call_id]
    if not pending:
        return  # deciding it says what is wrong
    if len(args_text(pending[0].args)) > LONG_ARGS_CHARS and not same_text(
        seen, args_digest(pending[0].args)
    ):
        raise DecisionRefused(
            f"open the whole call ({len(args_text(pending[0].args)):,} characters) before"
            " approving it"
        )


def _schedules_and_notes(
    web: Web,
) -> tuple[list[Schedule], list[Notification], list[tuple[int | None, str]]]:
    """Every schedule, the newest notifications, and when each schedule last started a
    run (notified, for a notify-only one), from its history; None, with what to say
    instead: "never", or "not in its last 200 firings" when the history kept is full
    of other firings (as `relay schedule show` says). (`last_run_ms` is where the next
    slot is counted from: when it was made, resumed or last claimed a slot, skipped ones
    too; not a firing.) The schedule
    store reads redis-py."""
    found = web.relay.schedules()
    lasts: list[tuple[int | None, str]] = []
    for schedule in found:
        kind: FiringKind = "notified" if schedule.mode == "notify" else "fired"
        entry, looked = web.relay.scheduling.last(schedule.name, kind)
        never = "never" if looked < HISTORY_MAX else f"not in its last {looked} firings"
        lasts.append((None, never) if entry is None else (entry.slot_ms, ""))
    return found, web.relay.notifications(limit=20), lasts


def _refused(web: Web, request: Request, why: str, status: int = 403) -> Response:
    return web.page(request, "refused.html", status, message=why)


def _fired_at(web: Web, tree: dict[str, Any]) -> str:
    """The firing that started a scheduled run, on its schedule's clock (UTC once the
    schedule is gone)."""
    name, fired = tree.get("schedule"), tree.get("fired_ms")
    if not name or fired is None:
        return ""
    found = web.relay.scheduling.get(name)
    return found.local_time(fired) if found is not None else local_iso(fired, 0)
