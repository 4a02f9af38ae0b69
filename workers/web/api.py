"""The JSON API of relay web, for scripts (basic auth, like the pages).

    GET  /api/runs?state=&limit=&before=       the newest runs in a state (running, waiting,
                                               finished, done, failed, cancelled, declined),
                                               a page: `X-Total-Count` says how many are in
                                               it, `Link: <...>; rel="next"` the next page
    GET  /api/runs/<id>                        one run, its specialists under it
    GET  /api/runs/<id>/trace?after=N          trace lines from position N on, and `next`;
                                               the run's state, tokens, cost and age now
    GET  /api/runs/<id>/live?after=ID          its replies as they are written (`relay.stream`'s
                                               events after stream id ID), and `next`
    GET  /api/pending                          what waits on a person
    POST /api/runs/<id>/calls/<call>/decision  {"approve": true|false, "reason": "...",
                                               "args": {...} to approve with edited arguments}
    POST /api/runs/<id>/plan/decision          {"approve": true|false, "step": N}
    POST /api/runs/<id>/answer                 {"text": "...", "step": N}: the question of step
                                               N (`relay answer`)
    POST /api/runs/<id>/budget                 {"calls": N, "tokens": N, "usd": X, "minutes": X,
                                               "step": N}: raise the tree's limits, the run
                                               parked at step N goes on (`relay extend`);
                                               once: a second raise of that wait, or one
                                               too small for the call it parked at (the
                                               run would stay parked), is refused (409),
                                               raising nothing

A plan, answer or budget decision names its `step` (a whole number; 400 without
it). A decision must be sent as `application/json` (a page on another site cannot
send that without a preflight, which this server never grants). Errors are
`{"error": "..."}` with 400, 403, 404 or 409.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from workers.engine.ids import in_tree
from workers.errors import DecisionRefused, RunNotFound
from workers.settings import now_ms
from workers.store import reads
from workers.store.live import stream_id
from workers.web.auth import cross_site, whole_number
from workers.web.site import Web
from workers.web.views import (
    BUDGET_FIELDS,
    budget_raise,
    pending_row,
    run_row,
    run_tree,
    runs_page,
    trace_row,
)

__all__ = ["routes"]

MAX_BODY_BYTES = 262_144
"""A decision's body, edited arguments included."""
TRACE_POSITION_MAX = 2**53
"""Trace positions count lines ever written: a larger one is no position."""


def _error(message: str, status: int) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


class _Api:
    def __init__(self, web: Web) -> None:
        self.web = web

    async def runs(self, request: Request) -> Response:
        query = request.query_params
        limit = whole_number(query.get("limit", "100"), 1_000)
        if not limit:
            return _error("limit is a number from 1 to 1000", 400)
        state, before = query.get("state", ""), query.get("before", "")
        try:
            page = await runs_page(self.web.arelay, state, limit, before, now_ms())
        except ValueError as error:
            return _error(str(error), 400)
        headers = {"X-Total-Count": str(page.total)}
        if page.next:
            more = urlencode({"state": state, "limit": limit, "before": page.next})
            headers["Link"] = f'</api/runs?{more}>; rel="next"'
        return JSONResponse(page.rows, headers=headers)

    async def run(self, request: Request) -> Response:
        relay = self.web.arelay
        try:
            status = await relay.status(request.path_params["run_id"])
        except RunNotFound as error:
            return _error(str(error), 404)
        return JSONResponse(await run_tree(relay, status, now_ms()))

    async def trace(self, request: Request) -> Response:
        relay = self.web.arelay
        run_id = request.path_params["run_id"]
        after = whole_number(request.query_params.get("after", "0"), TRACE_POSITION_MAX)
        if after is None:
            return _error("after is a trace position (a whole number)", 400)
        try:
            status = await relay.status(run_id)
        except RunNotFound as error:
            return _error(str(error), 404)
        position, entries = await relay.drive(reads.trace(relay.keys, run_id, after))
        rows = [trace_row(entry, self.web.settings.flower_url) for entry in entries]
        run = run_row(status, now_ms())  # what the run's page shows anew at each poll
        return JSONResponse(
            {"next": position, "entries": rows, "state": status.state,
             "waiting_for": status.waiting_for or "", "tokens": status.total_usage.total_tokens,
             "tokens_text": run["tokens_text"], "cost_text": run["cost_text"], "age": run["age"]}
        )  # fmt: skip

    async def live(self, request: Request) -> Response:
        relay = self.web.arelay
        run_id = request.path_params["run_id"]
        after = stream_id(request.query_params.get("after", "0"))
        if after is None:
            return _error("after is a stream id such as 0 or 1700000000000-0", 400)
        try:
            await relay.status(run_id)
        except RunNotFound as error:
            return _error(str(error), 404)
        events = await relay.drive(reads.live_events(relay.keys, run_id, after, None))
        mine = [e for e in events if in_tree(e.run_id, run_id)]
        next_id = events[-1].id if events else after
        return JSONResponse({"next": next_id, "events": [e.model_dump() for e in mine]})

    async def pending(self, _: Request) -> Response:
        now = now_ms()
        return JSONResponse([pending_row(p, now) for p in await self.web.arelay.pending()])

    async def decision(self, request: Request) -> Response:
        body = await _json_body(request)
        if isinstance(body, Response):
            return body
        approve = body.get("approve")
        if not isinstance(approve, bool):
            return _error('"approve" must be true or false', 400)
        run_id = request.path_params["run_id"]
        call_id = request.path_params.get("call_id")
        step = None if call_id else _step(body)
        if step is not None and not isinstance(step, int):
            return step
        kind, what = ("call", call_id) if call_id else ("plan", str(step))
        reason = str(body.get("reason", ""))[:2_000]
        args = body.get("args")
        if args is not None and (not call_id or not approve or not isinstance(args, dict)):
            return _error('"args" is an object, and goes with approving a call', 400)
        return await self._decided(
            request, kind, run_id, what, yes=approve, reason=reason, args=args
        )

    async def answer(self, request: Request) -> Response:
        """A question's answer, or a raise of the budget a run is parked at."""
        body = await _json_body(request)
        if isinstance(body, Response):
            return body
        kind = "question" if request.url.path.endswith("/answer") else "budget"
        step = _step(body)
        if not isinstance(step, int):
            return step
        text, more = body.get("text"), None
        if kind == "question" and not (isinstance(text, str) and text.strip()):
            return _error('"text" is the answer: non-empty text', 400)
        if kind == "budget":
            fields = {name: str(body[name]) for name, _, _ in BUDGET_FIELDS if name in body}
            raised = budget_raise(fields)
            if isinstance(raised, str):
                return _error(raised, 400)
            more = raised
        return await self._decided(
            request, kind, request.path_params["run_id"], str(step),
            yes=True, reason=str(text or "")[:20_000], more=more,
        )  # fmt: skip

    async def _decided(
        self, request: Request, kind: str, run_id: str, what: str, **decision: Any
    ) -> Response:
        """Decide in the signed-in user's name; what was done, or why not (404, 409)."""
        try:
            said = await self.web.decide(self.web.user(request), kind, run_id, what, **decision)
        except RunNotFound as error:
            return _error(str(error), 404)
        except DecisionRefused as error:
            return _error(str(error), 409)
        return JSONResponse({"done": said})


def routes(web: Web) -> list[Route]:
    """The API's routes, on `web`."""
    api = _Api(web)
    return [
        Route("/api/runs", api.runs),
        Route("/api/runs/{run_id}", api.run),
        Route("/api/runs/{run_id}/trace", api.trace),
        Route("/api/runs/{run_id}/live", api.live),
        Route("/api/pending", api.pending),
        Route("/api/runs/{run_id}/calls/{call_id}/decision", api.decision, methods=["POST"]),
        Route("/api/runs/{run_id}/plan/decision", api.decision, methods=["POST"]),
        Route("/api/runs/{run_id}/answer", api.answer, methods=["POST"]),
        Route("/api/runs/{run_id}/budget", api.answer, methods=["POST"]),
    ]


def _step(body: dict[str, Any]) -> int | Response:
    """The step a plan, question or budget decision names (what the person saw), or the
    400 that says it is missing: without it, nothing says which wait is decided."""
    step = body.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= 2**53:
        return _error('"step" is required: the step the run waits at (a whole number)', 400)
    return step


async def _json_body(request: Request) -> dict[str, Any] | Response:
    """The request's JSON object, or the error response that refuses it."""
    if cross_site(request.headers):
        return _error("a decision from another site is refused", 403)
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        return _error("send decisions as application/json", 415)
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        return _error("the body is too large", 413)
    try:
        body = json.loads(raw)
    except ValueError:
        return _error("the body is not JSON", 400)
    if not isinstance(body, dict):
        return _error("the body must be a JSON object", 400)
    return body
