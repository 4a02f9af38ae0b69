"""`relay routes`: the model routes as the fleet shares them now.

    route    model  limits             in flight  waiting  circuit                         ...
    primary  big    600 rpm, 400k tpm  3          12       paused (429) for 9s
    backup   small  120 rpm            1          0        open (5 failures), probe in 4s

and, last, each route's protocol (`json → text` once its server refused it; why, under
the table) and its last error and how long ago it came.
"""

from __future__ import annotations

import time

import click
from rich.table import Table
from rich.text import Text

from agent_core.text import counted
from workers.cli.common import Context, app_option, json_option, print_json, row, span
from workers.cli.live import console
from workers.model.limits import RouteState

__all__ = ["routes"]


@click.command()
@json_option
@app_option
@click.pass_obj
def routes(obj: Context, as_json: bool) -> None:
    """Show each model route: its limits, calls in flight and waiting, its circuit
    (closed, or open and probed once per interval), a 429's pause, its protocol (and
    whether its server refused it, so its workers speak text), the last error.

    The routes are the app's (`Relay(models=...)`), RELAY_MODELS's file, or the
    one RELAY_MODEL_URL makes; every worker shares what is shown here.
    """
    states = obj.relay.route_states()
    if as_json:
        print_json([state.model_dump(mode="json") for state in states])
        return
    out = console()
    if not states:
        out.print("No model routes: set RELAY_MODEL_URL, or RELAY_MODELS to a file of routes.")
        return
    now = time.time() * 1000
    table = Table(
        "route", "model", "limits", "in flight", "waiting", "circuit", "protocol", "last error",
        box=None, header_style="bold",
    )  # fmt: skip
    for state in states:
        table.add_row(
            *row(
                state.name,
                state.model,
                _limits(state),
                str(state.in_flight),
                str(state.waiting),
                _circuit(state, now),
                _protocol(state),
                _error(state, now),
            )
        )
    out.print(table)
    if any(state.circuit == "open" for state in states):
        out.print(Text("An open route gets one probe per interval; a success closes it.", "dim"))
    for state in states:
        if state.protocol_fallback:
            said = f"{state.name}: its server refused the {state.protocol} protocol, so its"
            out.print(Text(f"{said} workers speak text: {state.protocol_fallback[:300]}", "dim"))


def _limits(state: RouteState) -> str:
    parts = [
        f"{state.rpm} rpm" if state.rpm else "",
        f"{_count(state.tpm)} tpm" if state.tpm else "",
    ]
    if state.max_concurrency:
        parts.append(f"{state.max_concurrency} at once")
    return ", ".join(part for part in parts if part) or "none"


def _count(number: int | None) -> str:
    if number is None:
        return ""
    if number >= 1_000_000 and number % 100_000 == 0:
        return f"{number / 1_000_000:g}M"
    if number >= 1_000 and number % 100 == 0:
        return f"{number / 1_000:g}k"
    return str(number)


def _circuit(state: RouteState, now: float) -> str:
    if state.paused_until_ms is not None:
        return f"paused (429) for {span((state.paused_until_ms - now) / 1000)}"
    if state.circuit == "open":
        probe = state.next_probe_ms
        when = "now" if probe is None or probe <= now else f"in {span((probe - now) / 1000)}"
        return f"open ({counted(state.failures, 'failure')}), probe {when}"
    return "closed"


def _protocol(state: RouteState) -> str:
    return f"{state.protocol} → text" if state.protocol_fallback else state.protocol


def _error(state: RouteState, now: float) -> str:
    if not state.error:
        return ""
    ago = f" ({span((now - state.error_at_ms) / 1000)} ago)" if state.error_at_ms else ""
    return f"{state.error[:120]}{ago}"
