"""The MCP room without workers: servers' config, their tools as Relay tools, what a
call returned as output, and listings kept in a real private Redis (`workers.mcp`).

The toolset's tests start PyPI's `mcp-server-time` over stdio, as an app would;
everything else is pure.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import signal
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from pydantic import ValidationError

from agent_core import Kind, Risk, Tool
from tests.support.mcp_servers import faults, pypi_bin
from tests.support.redis_server import RedisServer
from workers import MCPServer, MCPServerError, SettingsError
from workers.mcp.config import checked_servers, load_servers
from workers.mcp.mapping import (
    FROM_OVERRIDE,
    FROM_TRUSTED,
    FROM_UNTRUSTED,
    PASSTHROUGH,
    Listed,
    MCPTool,
    digest,
    relay_tools,
    risk_of,
)
from workers.mcp.results import output_of
from workers.mcp.stderr import LINE_CHARS, ServerStderr
from workers.mcp.toolset import Listing, MCPToolset

ROOT = Path(__file__).resolve().parents[1]
SECRET = "s3cret-0f-the-team"


def _stdio(name: str = "s", **fields: Any) -> MCPServer:
    return MCPServer(name, command=["prog"], **fields)


def _listed(
    name: str,
    schema: dict[str, Any] | None = None,
    annotations: dict[str, Any] | None = None,
    description: str = "does a thing",
) -> Listed:
    return Listed(name, description, schema or {"type": "object"}, annotations or {})


def _one(server: MCPServer, entry: Listed, taken: tuple[str, ...] = ()) -> MCPTool:
    [made] = relay_tools([(server, [entry])], taken)
    return made


def _args(tool: Tool) -> dict[str, tuple[Kind, bool, str]]:
    return {a.name: (a.kind, a.required, a.help) for a in tool.args}


# --- config: MCPServer ----------------------------------------------------------------


def test_a_server_is_a_command_or_a_url_never_both_nor_neither() -> None:
    assert _stdio().command == ("prog",)
    assert MCPServer("h", url="https://tickets.internal/mcp").url == "https://tickets.internal/mcp"
    with pytest.raises(ValidationError, match="either a command"):
        MCPServer("n")
    with pytest.raises(ValidationError, match="either a command"):
        MCPServer("b", command=["prog"], url="https://x.example/mcp")
    with pytest.raises(ValidationError, match="names a program"):
        MCPServer("e", command=[])
    with pytest.raises(ValidationError, match="names a program"):
        MCPServer("e", command=["", "arg"])


@pytest.mark.parametrize("name", ["", "1st", "has space", "dot.name", "a/b", "é", "a" * 33])
def test_a_server_name_other_than_32_letters_digits_dash_or_underscore_is_refused(
    name: str,
) -> None:
    with pytest.raises(ValidationError, match="1 to 32 letters"):
        _stdio(name)


@pytest.mark.parametrize("name", ["a", "fs", "my-server_2", "A" * 32])
def test_a_good_server_name_is_kept(name: str) -> None:
    assert _stdio(name).name == name


@pytest.mark.parametrize(
    "url",
    [
        "ftp://files.example",
        "tickets.internal/mcp",
        "http://",
        "https:///path",
        "//x",
        "http://host with spaces/mcp",
    ],
)
def test_a_url_that_is_not_http_or_https_is_refused(url: str) -> None:
    with pytest.raises(ValidationError, match="http:// or https://"):
        MCPServer("h", url=url)


@pytest.mark.parametrize("header", ["Bad Name", "X:Y", "", "X\nY", "Ünicode"])
def test_a_header_name_http_does_not_allow_is_refused(header: str) -> None:
    with pytest.raises(ValidationError, match="not an HTTP header name"):
        MCPServer("h", url="https://x.example", headers={header: "v"})


@pytest.mark.parametrize("value", ["env:", "env:1TOKEN", "env:A-B", "env:A B", "env:$X"])
def test_an_env_header_value_must_name_an_environment_variable(value: str) -> None:
    with pytest.raises(ValidationError, match="must name an environment variable"):
        MCPServer("h", url="https://x.example", headers={"Authorization": value})


def test_a_server_is_frozen_and_takes_no_unknown_field() -> None:
    server = _stdio()
    with pytest.raises(ValidationError):
        server.name = "other"  # type: ignore[misc]
    with pytest.raises(ValidationError):
        server.command = ("other",)  # type: ignore[misc]
    assert server.name == "s"
    with pytest.raises(ValidationError, match="Extra inputs"):
        _stdio(typo=1)


def test_repr_and_str_never_show_a_header_value_or_an_env_value() -> None:
    http = MCPServer(
        "tickets",
        url="https://tickets.internal/mcp",
        headers={"Authorization": f"Bearer {SECRET}", "X-Key": "env:TICKETS_TOKEN"},
    )
    stdio = MCPServer("fs", command=["prog", "/data"], env={"API_KEY": SECRET})
    for server in (http, stdio):
        for shown in (repr(server), str(server), server.where):
            assert SECRET not in shown
    assert "TICKETS_TOKEN" not in repr(http)
    assert "tickets" in repr(http)  # it is still a useful repr
    assert http.where == "https://tickets.internal/mcp"
    assert stdio.where == "prog /data"
    assert SECRET not in json.dumps(http.identity()) + json.dumps(stdio.identity())


def test_resolved_headers_read_env_values_from_the_environ_given() -> None:
    server = MCPServer(
        "tickets",
        url="https://tickets.internal/mcp",
        headers={"Authorization": "env:TICKETS_TOKEN", "X-Team": "relay"},
    )
    resolved = server.resolved_headers({"TICKETS_TOKEN": SECRET})
    assert resolved == {"Authorization": SECRET, "X-Team": "relay"}
    assert server.headers["Authorization"] == "env:TICKETS_TOKEN"  # the server is unchanged


@pytest.mark.parametrize("environ", [{}, {"TICKETS_TOKEN": ""}, {"OTHER": "x"}])
def test_an_unset_env_header_raises_naming_the_variable_and_the_server(
    environ: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TICKETS_TOKEN", SECRET)  # the process's own is not read: environ is given
    server = MCPServer(
        "tickets",
        url="https://tickets.internal/mcp",
        headers={"Authorization": "env:TICKETS_TOKEN"},
    )
    with pytest.raises(MCPServerError) as raised:
        server.resolved_headers(environ)
    message = str(raised.value)
    assert "TICKETS_TOKEN" in message
    assert "tickets" in message
    assert "Authorization" in message
    assert SECRET not in message


def test_resolved_headers_read_the_process_environment_when_none_is_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RELAY_TEST_MCP_TOKEN", SECRET)
    server = MCPServer(
        "h", url="https://x.example", headers={"Authorization": "env:RELAY_TEST_MCP_TOKEN"}
    )
    assert server.resolved_headers() == {"Authorization": SECRET}


# --- config: RELAY_MCP's file ---------------------------------------------------------


def test_load_servers_reads_a_json_object_of_servers(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    path.write_text(
        json.dumps(
            {
                "servers": [
                    {"name": "fs", "command": ["prog", "/data"], "env": {"K": "v"}},
                    {
                        "name": "tickets",
                        "url": "https://tickets.internal/mcp",
                        "headers": {"Authorization": "env:TOKEN"},
                        "risk": {"pay": "money"},
                        "idempotent": {"pay": True},
                        "timeout": 5,
                    },
                ]
            }
        )
    )
    fs, tickets = load_servers(path)
    assert fs == MCPServer("fs", command=["prog", "/data"], env={"K": "v"})
    assert tickets.url == "https://tickets.internal/mcp"
    assert tickets.headers == {"Authorization": "env:TOKEN"}
    assert tickets.risk == {"pay": Risk.MONEY}
    assert tickets.idempotent == {"pay": True}
    assert tickets.timeout == 5


def test_load_servers_reads_a_bare_json_list(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps([{"name": "a", "command": ["x"]}, {"name": "b", "command": ["y"]}]))
    assert [s.name for s in load_servers(str(path))] == ["a", "b"]


def test_load_servers_reads_toml_servers_tables(tmp_path: Path) -> None:
    path = tmp_path / "mcp.toml"
    path.write_text(
        "[[servers]]\n"
        'name = "time"\n'
        'command = ["mcp-server-time", "--local-timezone", "UTC"]\n'
        "connect_timeout = 5\n"
        "\n"
        "[[servers]]\n"
        'name = "tickets"\n'
        'url = "https://tickets.internal/mcp"\n'
        "[servers.risk]\n"
        'pay = "money"\n'
    )
    first, second = load_servers(path)
    assert first.command == ("mcp-server-time", "--local-timezone", "UTC")
    assert first.connect_timeout == 5
    assert second.name == "tickets"
    assert second.risk == {"pay": Risk.MONEY}


def _load_error(path: Path) -> str:
    with pytest.raises(SettingsError) as raised:
        load_servers(path)
    message = str(raised.value)
    assert "\n" not in message, message
    assert message.startswith("RELAY_MCP: ")
    assert str(path) in message
    return message


def test_an_unreadable_file_is_one_settings_error_line(tmp_path: Path) -> None:
    assert "cannot read" in _load_error(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    assert "cannot read" in _load_error(tmp_path / "bad.json")
    (tmp_path / "bad.toml").write_text("[[servers]\nname = ")
    assert "cannot read" in _load_error(tmp_path / "bad.toml")
    (tmp_path / "latin.json").write_bytes(b'["\xff"]')
    assert "cannot read" in _load_error(tmp_path / "latin.json")


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("deep.json", '{"servers": ' + "[" * 100_000 + "]" * 100_000 + "}"),
        ("deep.toml", "servers = " + "[" * 100_000 + "]" * 100_000),
        ("tables.toml", "[[servers]]\nname = " + "{a = " * 5_000 + "1" + "}" * 5_000),
    ],
)
def test_a_file_nested_too_deeply_is_one_line_naming_it(
    tmp_path: Path, name: str, text: str
) -> None:
    (tmp_path / name).write_text(text)
    assert _load_error(tmp_path / name).endswith(": it is nested too deeply")


@pytest.mark.parametrize("text", ["[]", '{"servers": []}', "{}", '{"servers": {}}', "null", "3"])
def test_a_file_listing_no_servers_is_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "mcp.json"
    path.write_text(text)
    assert "lists no servers" in _load_error(path)


def test_an_entry_that_is_not_a_table_is_refused_by_its_number(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps([{"name": "a", "command": ["x"]}, "b"]))
    assert "server 2 is not a table of fields" in _load_error(path)


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        ({"name": "b", "url": "ftp://x"}, "url"),
        ({"name": "1b", "command": ["x"]}, "name"),
        ({"name": "b", "command": ["x"], "timeout": -1}, "timeout"),
        ({"name": "b", "command": ["x"], "risk": {"pay": "lots"}}, "risk.pay"),
        ({"name": "b", "command": ["x"], "typo": 1}, "typo"),
        ({"name": "b"}, "the server"),
    ],
)
def test_a_bad_field_names_the_file_the_server_number_and_the_field(
    tmp_path: Path, entry: dict[str, Any], field: str
) -> None:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"servers": [{"name": "a", "command": ["x"]}, entry]}))
    assert f"server 2: {field}: " in _load_error(path)


def test_a_header_value_never_reaches_the_settings_error(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    bad = {"name": "b", "url": "https://x.example", "headers": {"Bad Name": SECRET}}
    path.write_text(json.dumps([bad]))
    message = _load_error(path)
    assert "server 1: headers: " in message
    assert SECRET not in message


def test_a_file_naming_two_servers_alike_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps([{"name": "a", "command": ["x"]}, {"name": "a", "url": "http://h"}]))
    with pytest.raises(SettingsError, match="two MCP servers are named 'a'"):
        load_servers(path)


def test_checked_servers_gives_a_tuple_of_distinct_servers() -> None:
    a, b = _stdio("a"), _stdio("b")
    assert checked_servers(None) == ()
    assert checked_servers([a, b]) == (a, b)
    assert checked_servers((b,)) == (b,)
    with pytest.raises(SettingsError, match="two MCP servers are named 'a'"):
        checked_servers([a, b, _stdio("a")])


@pytest.mark.parametrize(
    "given",
    [
        [{"name": "a", "command": ["x"]}],
        ["a"],
        "a",
        MCPServer("a", command=["x"]),
        {"a": MCPServer("a", command=["x"])},
    ],
)
def test_checked_servers_refuses_anything_but_a_list_of_servers(given: object) -> None:
    with pytest.raises(SettingsError, match=r"list of workers\.MCPServer"):
        checked_servers(given)


# --- mapping: risk ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("annotations", "risk"),
    [
        ({"readOnlyHint": True}, Risk.READ),
        ({"readOnlyHint": True, "openWorldHint": True}, Risk.READ),
        ({"readOnlyHint": True, "destructiveHint": True}, Risk.READ),
        ({"openWorldHint": True}, Risk.OUTSIDE),
        ({"openWorldHint": True, "destructiveHint": False}, Risk.OUTSIDE),
        ({"readOnlyHint": False, "openWorldHint": True}, Risk.OUTSIDE),
        ({"destructiveHint": False}, Risk.CREATE),
        ({"destructiveHint": False, "openWorldHint": False}, Risk.CREATE),
        ({"destructiveHint": True}, Risk.WRITE),
        ({"readOnlyHint": False}, Risk.WRITE),
        ({"openWorldHint": False}, Risk.WRITE),
        ({}, Risk.WRITE),
        ({"readOnlyHint": "true"}, Risk.WRITE),  # a hint is true only when it is true
    ],
)
def test_a_trusted_servers_risk_follows_the_annotation_table(
    annotations: dict[str, Any], risk: Risk
) -> None:
    assert risk_of(annotations) is risk
    made = _one(_stdio(trust_annotations=True), _listed("t", annotations=annotations))
    assert (made.tool.risk_class, made.risk_from) == (risk, FROM_TRUSTED)


@pytest.mark.parametrize(
    "annotations",
    [
        {"readOnlyHint": True},
        {"readOnlyHint": True, "idempotentHint": True},
        {"destructiveHint": False, "idempotentHint": True},
        {"openWorldHint": False, "readOnlyHint": True, "destructiveHint": False},
        {},
    ],
)
def test_an_untrusted_servers_tools_are_write_and_not_idempotent_whatever_they_claim(
    annotations: dict[str, Any],
) -> None:
    made = _one(_stdio(), _listed("wipe", annotations=annotations))
    assert (made.tool.risk_class, made.idempotent, made.risk_from) == (
        Risk.WRITE,
        False,
        FROM_UNTRUSTED,
    )


def test_a_server_is_untrusted_unless_the_operator_says_so(tmp_path: Path) -> None:
    assert _stdio().trust_annotations is False
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps([{"name": "fs", "command": ["x"], "trust_annotations": True}]))
    [server] = load_servers(path)
    assert server.trust_annotations is True


# --- mapping: names --------------------------------------------------------------------


@pytest.mark.parametrize("reserved", ["ask_user", "delegate", "remember", "read_skill_file"])
def test_a_name_the_agent_keeps_for_itself_is_prefixed_with_the_servers_name(
    reserved: str,
) -> None:
    [made] = relay_tools([(_stdio("srv"), [_listed(reserved)])], taken=[])
    assert (made.remote, made.tool.name) == (reserved, f"srv_{reserved}")


def test_a_validation_error_never_quotes_a_header_or_env_value() -> None:
    with pytest.raises(ValidationError) as raised:
        MCPServer("t", url="https://x", headers={"Bad Name": "Bearer s3cret"})
    assert "s3cret" not in str(raised.value)
    with pytest.raises(ValidationError) as raised:
        MCPServer("t", env={"TOKEN": "s3cret"})  # neither command nor url
    assert "s3cret" not in str(raised.value)


def test_tools_keep_their_names_in_order_when_nothing_collides() -> None:
    a, b = _stdio("a"), _stdio("b")
    made = relay_tools(
        [(a, [_listed("one"), _listed("two")]), (b, [_listed("three")])], taken=["mine"]
    )
    assert [(m.server, m.remote, m.tool.name) for m in made] == [
        ("a", "one", "one"),
        ("a", "two", "two"),
        ("b", "three", "three"),
    ]


def test_a_name_two_servers_list_is_prefixed_with_each_servers_name() -> None:
    a, b = _stdio("a"), _stdio("b")
    made = relay_tools([(a, [_listed("search"), _listed("own")]), (b, [_listed("search")])], [])
    assert [(m.server, m.remote, m.tool.name) for m in made] == [
        ("a", "search", "a_search"),
        ("a", "own", "own"),
        ("b", "search", "b_search"),
    ]


def test_a_name_a_python_tool_has_is_prefixed_with_the_servers_name() -> None:
    made = relay_tools([(_stdio("time"), [_listed("read_note"), _listed("now")])], ["read_note"])
    assert [m.tool.name for m in made] == ["time_read_note", "now"]
    assert made[0].remote == "read_note"  # the call still names the server's own tool


@pytest.mark.parametrize(
    ("remote", "local"),
    [("get.thing", "get_thing"), ("1st", "_1st"), ("a/b", "a_b"), ("día", "d_a"), ("", "_")],
)
def test_a_name_the_core_refuses_is_spelled_with_underscores(remote: str, local: str) -> None:
    made = _one(_stdio(), _listed(remote))
    assert made.tool.name == local
    assert made.remote == remote


def test_names_that_spell_alike_on_two_servers_are_both_prefixed() -> None:
    made = relay_tools([(_stdio("a"), [_listed("get.x")]), (_stdio("b"), [_listed("get_x")])], [])
    assert [m.tool.name for m in made] == ["a_get_x", "b_get_x"]


def test_two_tools_that_would_still_share_a_name_raise() -> None:
    with pytest.raises(MCPServerError, match=r"'get_x'.*another tool has"):
        relay_tools([(_stdio("a"), [_listed("get.x"), _listed("get_x")])], [])


# --- mapping: risk and idempotency overrides -------------------------------------------


def test_the_teams_risk_override_beats_the_annotations() -> None:
    server = _stdio(risk={"charge": Risk.CREATE, "peek": Risk.OUTSIDE}, trust_annotations=True)
    made = relay_tools(
        [
            (
                server,
                [
                    _listed("charge", annotations={"destructiveHint": True}),
                    _listed("peek", annotations={"readOnlyHint": True}),
                    _listed("other", annotations={"readOnlyHint": True}),
                ],
            )
        ],
        [],
    )
    assert [m.tool.risk_class for m in made] == [Risk.CREATE, Risk.OUTSIDE, Risk.READ]
    assert [m.risk_from for m in made] == [FROM_OVERRIDE, FROM_OVERRIDE, FROM_TRUSTED]


def test_an_untrusted_servers_override_is_the_teams_word() -> None:
    made = _one(_stdio(risk={"peek": Risk.READ}), _listed("peek", annotations={}))
    assert (made.tool.risk_class, made.idempotent, made.risk_from) == (
        Risk.READ,
        True,
        FROM_OVERRIDE,
    )


def test_a_risk_override_applies_to_the_renamed_tool_too() -> None:
    server = _stdio("pay", risk={"send": Risk.MONEY})
    made = _one(server, _listed("send"), taken=("send",))
    assert made.tool.name == "pay_send"
    assert made.tool.risk_class is Risk.MONEY


def test_idempotent_comes_from_a_trusted_hint_or_read_only_unless_overridden() -> None:
    server = _stdio(idempotent={"put": False, "post": True}, trust_annotations=True)
    made = relay_tools(
        [
            (
                server,
                [
                    _listed("hinted", annotations={"idempotentHint": True}),
                    _listed("read", annotations={"readOnlyHint": True}),
                    _listed("plain"),
                    _listed("hint_false", annotations={"idempotentHint": False}),
                    _listed("put", annotations={"idempotentHint": True}),
                    _listed("post", annotations={"destructiveHint": True}),
                ],
            )
        ],
        [],
    )
    assert {m.remote: m.idempotent for m in made} == {
        "hinted": True,
        "read": True,
        "plain": False,
        "hint_false": False,
        "put": False,
        "post": True,
    }


@pytest.mark.parametrize("trusted", [True, False])
def test_a_risk_override_decides_idempotency_over_the_hint(trusted: bool) -> None:
    server = _stdio(
        risk={"lookup": Risk.READ, "put": Risk.WRITE, "add": Risk.CREATE},
        trust_annotations=trusted,
    )
    made = relay_tools(
        [
            (
                server,
                [
                    _listed("lookup", annotations={"idempotentHint": False}),
                    _listed("put", annotations={"idempotentHint": True, "readOnlyHint": True}),
                    _listed("add", annotations={"idempotentHint": True}),
                ],
            )
        ],
        [],
    )
    # READ is idempotent, any other risk is not: the hint no longer counts.
    assert {m.remote: m.idempotent for m in made} == {"lookup": True, "put": False, "add": False}


def test_idempotent_beats_a_risk_override_both_ways_by_either_name() -> None:
    server = _stdio(
        risk={"lookup": Risk.READ, "put": Risk.WRITE},
        idempotent={"lookup": False, "s_put": True},  # `put` is renamed s_put: taken
    )
    made = relay_tools([(server, [_listed("lookup"), _listed("put")])], ["put"])
    assert [(m.tool.name, m.tool.risk_class, m.idempotent) for m in made] == [
        ("lookup", Risk.READ, False),
        ("s_put", Risk.WRITE, True),
    ]


@pytest.mark.parametrize("field", ["risk", "idempotent"])
def test_an_override_naming_no_tool_is_an_error_naming_it_and_the_servers_tools(
    field: str,
) -> None:
    said: dict[str, Any] = {"chrage": Risk.MONEY} if field == "risk" else {"chrage": False}
    server = _stdio("pay", trust_annotations=True, **{field: said})
    listed = [_listed("refund"), _listed("charge", annotations={"readOnlyHint": True})]
    with pytest.raises(MCPServerError) as raised:
        relay_tools([(server, listed)], [])
    assert str(raised.value) == (
        f"MCP server pay: its {field} names 'chrage', which is none of its tools (charge,"
        " refund); correct or remove the entry: a misspelt one would leave its tool at the"
        " default risk"
    )


def test_an_override_may_name_a_tool_by_any_of_its_names() -> None:
    server = _stdio("pay", risk={"pay_charge": Risk.MONEY, "odd_name": Risk.READ})
    made = relay_tools([(server, [_listed("charge"), _listed("odd name")])], [])
    assert [(t.tool.name, t.tool.risk_class) for t in made] == [
        ("charge", Risk.MONEY),
        ("odd_name", Risk.READ),
    ]


def test_a_long_listing_is_named_in_part_in_the_error() -> None:
    listed = [_listed(f"tool{n:02}") for n in range(40)]
    with pytest.raises(MCPServerError, match=r"\(tool00, .*, tool29 and 10 more\)"):
        relay_tools([(_stdio(idempotent={"tool40": True}), listed)], [])


def test_a_money_override_is_never_idempotent_unless_the_override_says_so() -> None:
    hinted = {"idempotentHint": True, "readOnlyHint": True}
    plain = _one(_stdio(risk={"pay": Risk.MONEY}), _listed("pay", annotations=hinted))
    assert plain.tool.risk_class is Risk.MONEY
    assert plain.idempotent is False
    said = _stdio(risk={"pay": Risk.MONEY}, idempotent={"pay": True})
    assert _one(said, _listed("pay", annotations=hinted)).idempotent is True


# --- mapping: arguments ----------------------------------------------------------------


def test_each_json_type_becomes_the_cores_kind_required_or_optional() -> None:
    schema = {
        "type": "object",
        "properties": {
            "s": {"type": "string", "description": "a text"},
            "i": {"type": "integer"},
            "n": {"type": "number"},
            "b": {"type": "boolean"},
            "a": {"type": "array", "items": {"type": "string"}},
            "o": {"type": "object"},
        },
        "required": ["s", "i", "a"],
    }
    made = _one(_stdio(), _listed("t", schema))
    assert made.passthrough is False
    assert _args(made.tool) == {
        "s": (Kind.TEXT, True, "a text"),
        "i": (Kind.INTEGER, True, ""),
        "n": (Kind.NUMBER, False, ""),
        "b": (Kind.BOOLEAN, False, ""),
        "a": (Kind.LIST, True, ""),
        "o": (Kind.OBJECT, False, ""),
    }
    assert made.arguments({"s": "x", "i": 1}) == {"s": "x", "i": 1}


@pytest.mark.parametrize(
    "prop",
    [
        {"type": ["string", "null"]},
        {"type": ["null", "string"]},
        {"anyOf": [{"type": "string"}, {"type": "null"}]},
        {"anyOf": [{"type": "null"}, {"type": "string"}], "default": None, "title": "Note"},
    ],
)
def test_a_nullable_string_is_optional_text_even_when_required(prop: dict[str, Any]) -> None:
    schema = {"type": "object", "properties": {"note": prop}, "required": ["note"]}
    made = _one(_stdio(), _listed("t", schema))
    assert made.passthrough is False
    [arg] = made.tool.args
    assert (arg.name, arg.kind, arg.required) == ("note", Kind.TEXT, False)


def test_a_string_enum_adds_its_choices_to_the_help() -> None:
    schema = {
        "type": "object",
        "properties": {
            "unit": {"type": "string", "enum": ["c", "f"], "description": "The unit."},
            "bare": {"type": "string", "enum": ["x", "y", "z"]},
            "number": {"type": "integer", "enum": [1, 2]},
        },
        "required": ["unit"],
    }
    args = _args(_one(_stdio(), _listed("t", schema)).tool)
    assert args["unit"] == (Kind.TEXT, True, "The unit. one of: c, f")
    assert args["bare"] == (Kind.TEXT, False, "one of: x, y, z")
    assert args["number"] == (Kind.INTEGER, False, "")


def test_a_schema_with_no_properties_is_a_tool_without_arguments() -> None:
    made = _one(_stdio(), _listed("now", {"type": "object", "properties": {}}))
    assert made.passthrough is False
    assert made.tool.args == ()
    assert made.arguments({}) == {}


@pytest.mark.parametrize(
    "schema",
    [
        {
            "type": "object",
            "properties": {"v": {"anyOf": [{"type": "string"}, {"type": "integer"}]}},
        },
        {"type": "object", "properties": {"v": {"type": ["string", "integer"]}}},
        {"type": "object", "properties": {"v": {"$ref": "#/$defs/Thing"}}},
        {"type": "object", "properties": {"v": {"type": "string", "$ref": "#/$defs/Thing"}}},
        {"$ref": "#/$defs/Args", "$defs": {"Args": {"type": "object"}}},
        {"type": "array", "items": {"type": "string"}},
        {"type": "object", "properties": {"v": {"type": "date"}}},
        {"type": "object", "properties": {"v": "string"}},
        {"type": "object", "properties": [{"v": {"type": "string"}}]},
        {"type": "object", "properties": {"first.name": {"type": "string"}}},
    ],
)
def test_a_schema_the_core_cannot_say_is_passed_through_as_one_object(
    schema: dict[str, Any],
) -> None:
    made = _one(_stdio(risk={"t": Risk.OUTSIDE}), _listed("t", schema))
    assert made.passthrough is True
    [arg] = made.tool.args
    assert (arg.name, arg.kind, arg.required) == (PASSTHROUGH, Kind.OBJECT, True)
    assert json.dumps(schema, separators=(",", ":"), sort_keys=True) in arg.help
    assert made.tool.risk_class is Risk.OUTSIDE  # the risk survives the fallback
    given = {"v": [1, {"deep": None}], "w": "x"}
    assert made.arguments({PASSTHROUGH: given}) == given
    assert made.arguments({}) == {}


def test_a_huge_passed_through_schema_is_cut_in_the_help() -> None:
    schema = {"$ref": "#/x", "description": "y" * 10_000}
    [arg] = _one(_stdio(), _listed("t", schema)).tool.args
    assert len(arg.help) < 2_000
    assert "[… cut:" in arg.help


def test_a_tool_without_a_description_is_described_by_its_name_and_server() -> None:
    made = _one(_stdio("srv"), _listed("t", description=""))
    assert made.tool.description == "t (from MCP server srv)"


# --- mapping: digest -------------------------------------------------------------------


def test_the_digest_ignores_tool_order() -> None:
    one = _listed("a", {"type": "object", "properties": {"x": {"type": "string"}}})
    two = _listed("b", annotations={"readOnlyHint": True})
    assert digest([one, two]) == digest([two, one])
    assert digest([one, two]) == digest((Listed.from_json(one.as_json()), two))
    assert len(digest([one])) == 16


@pytest.mark.parametrize(
    "changed",
    [
        Listed("b", "does a thing", {"type": "object"}, {}),
        Listed("a", "does another thing", {"type": "object"}, {}),
        Listed("a", "does a thing", {"type": "object", "properties": {}}, {}),
        Listed("a", "does a thing", {"type": "object"}, {"readOnlyHint": True}),
    ],
)
def test_the_digest_changes_when_any_field_changes(changed: Listed) -> None:
    base = [_listed("a"), _listed("z")]
    assert digest(base) != digest([changed, _listed("z")])
    assert digest(base) != digest(base[:1])


# --- results ---------------------------------------------------------------------------


def test_text_blocks_are_joined_by_newlines() -> None:
    result = {"content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]}
    out = output_of(result, 1_000)
    assert (out.status, out.text) == ("ok", "one\ntwo")


def test_an_image_or_audio_is_described_by_type_and_size_never_its_bytes() -> None:
    data = base64.b64encode(b"\x89PNG" + b"\0" * 1_020).decode()
    out = output_of(
        {
            "content": [
                {"type": "image", "data": data, "mimeType": "image/png"},
                {
                    "type": "audio",
                    "data": base64.b64encode(b"abc").decode(),
                    "mimeType": "audio/wav",
                },
                {"type": "image", "data": "not base64!"},
                {"type": "audio"},
            ]
        },
        10_000,
    )
    assert out.text.splitlines() == [
        "[image: image/png, 1,024 bytes]",
        "[audio: audio/wav, 3 bytes]",
        "[image: unknown type, data that is not base64]",
        "[audio: unknown type, no data]",
    ]
    assert data[:40] not in out.text


def test_resources_and_links_are_shown_by_their_uri() -> None:
    blob = base64.b64encode(b"x" * 2_048).decode()
    out = output_of(
        {
            "content": [
                {"type": "resource", "resource": {"uri": "file:///a.txt", "text": "its text"}},
                {
                    "type": "resource",
                    "resource": {"uri": "file:///b.bin", "blob": blob, "mimeType": "app/x"},
                },
                {"type": "resource", "resource": "nonsense"},
                {"type": "resource_link", "uri": "file:///c.txt", "name": "c"},
                {"type": "resource_link", "uri": "file:///d.txt"},
            ]
        },
        10_000,
    )
    assert out.text.splitlines() == [
        "[resource file:///a.txt]",
        "its text",
        "[resource file:///b.bin: app/x, 2,048 bytes]",
        "[a resource it did not describe]",
        "[resource link c: file:///c.txt]",
        "[resource link file:///d.txt: file:///d.txt]",
    ]
    assert blob[:40] not in out.text


def test_an_unknown_block_is_named_not_shown() -> None:
    out = output_of({"content": [{"type": "video", "data": SECRET}, "not a block"]}, 1_000)
    assert out.text == "[content of type 'video', not shown]"


def test_structured_content_is_the_output_only_when_there_is_no_text() -> None:
    structured = {"temperature": 21.5, "unit": "°C"}
    alone = output_of({"content": [], "structuredContent": structured}, 1_000)
    assert json.loads(alone.text) == structured
    assert "°C" in alone.text  # not escaped
    both = output_of(
        {"content": [{"type": "text", "text": "21.5 °C"}], "structuredContent": structured},
        1_000,
    )
    assert both.text == "21.5 °C"
    assert output_of({}, 1_000).text == ""


def test_is_error_makes_an_error_output_with_a_sentence_when_it_says_nothing() -> None:
    said = output_of({"content": [{"type": "text", "text": "no such city"}], "isError": True}, 100)
    assert (said.status, said.text) == ("error", "no such city")
    silent = output_of({"content": [], "isError": True}, 100)
    assert silent.status == "error"
    assert silent.text == "the MCP tool reported an error and said nothing more"
    assert output_of({"content": [], "isError": False}, 100).status == "ok"


def test_the_output_is_cut_to_the_limit_with_the_cores_marker() -> None:
    out = output_of({"content": [{"type": "text", "text": "x" * 5_000}]}, 200)
    assert out.status == "ok"
    assert len(out.text) <= 200
    kept = out.text.count("x")
    assert out.text.endswith(f"\n[… cut: {5_000 - kept} more characters]")
    assert output_of({"content": [{"type": "text", "text": "x" * 200}]}, 200).text == "x" * 200
    failed = output_of({"content": [{"type": "text", "text": "y" * 5_000}], "isError": True}, 200)
    assert failed.status == "error"
    assert "more characters]" in failed.text


# --- toolset: listings kept in a real Redis --------------------------------------------


PREFIX = "t:"


@pytest.fixture
def client(tmp_path: Path) -> Iterator[redis.Redis]:
    with RedisServer(tmp_path) as server:
        yield redis.Redis.from_url(server.url)


def _children(program: str) -> list[int]:
    """The pids of this process's children running `program` (Linux's /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            head, _, tail = stat.read_text().rpartition(")")  # its name may hold spaces
        except OSError:
            continue  # it ended meanwhile
        pid, _, name = head.partition(" (")
        if name == program and int(tail.split()[1]) == os.getpid():
            found.append(int(pid))
    return found


def _time_server() -> MCPServer:
    return MCPServer("time", command=[pypi_bin("mcp-server-time")])


def _stored(client: redis.Redis, key: str) -> dict[str, Any]:
    raw = client.get(key)
    assert isinstance(raw, bytes)
    data: dict[str, Any] = json.loads(raw)
    return data


def _forged(listing: Listing) -> tuple[Listed, ...]:
    """The listing with one tool's description changed: what no server lists."""
    first, *rest = listing.tools
    edited = Listed(first.name, "forged by the test", first.input_schema, first.annotations)
    return (edited, *rest)


def test_the_first_listing_asks_the_server_and_a_second_toolset_reads_redis(
    client: redis.Redis,
) -> None:
    server = _time_server()
    toolset = MCPToolset("notes", [server], output_chars=1_000)
    [listing] = toolset.listings(client, PREFIX)
    names = {t.name for t in listing.tools}
    assert {"get_current_time", "convert_time"} <= names
    assert listing.server == server
    assert listing.digest == digest(listing.tools)
    key = toolset.key(PREFIX, server)
    assert key.startswith(f"{PREFIX}mcp-tools:notes:time:")
    stored = _stored(client, key)
    assert stored["digest"] == listing.digest
    assert [t["name"] for t in stored["tools"]] == [t.name for t in listing.tools]

    # What Redis keeps is the app's listing: a second toolset does not ask the server.
    forged = _forged(listing)
    client.set(key, json.dumps({"digest": digest(forged), "tools": [t.as_json() for t in forged]}))
    again = MCPToolset("notes", [_time_server()], output_chars=1_000)
    [read] = again.listings(client, PREFIX)
    assert read.tools == forged
    assert read.digest == digest(forged) != listing.digest

    # `refresh` lists the server again and replaces what Redis keeps.
    [fresh] = again.listings(client, PREFIX, refresh=True)
    assert fresh.tools == listing.tools
    assert fresh.digest == listing.digest
    assert _stored(client, key)["digest"] == listing.digest


def test_the_key_is_per_app_server_and_identity_never_its_secrets() -> None:
    toolset = MCPToolset("notes", [], output_chars=1_000)
    server = MCPServer("h", url="https://x.example/mcp", headers={"A": "env:TOKEN"})
    assert toolset.key(PREFIX, server) == MCPToolset("notes", [], 5).key(PREFIX, server)
    assert toolset.key(PREFIX, server) != MCPToolset("other", [], 5).key(PREFIX, server)
    moved = MCPServer("h", url="https://y.example/mcp", headers={"A": "env:TOKEN"})
    assert toolset.key(PREFIX, server) != toolset.key(PREFIX, moved)
    rekeyed = MCPServer("h", url="https://x.example/mcp", headers={"A": "env:OTHER"})
    assert toolset.key(PREFIX, server) == toolset.key(PREFIX, rekeyed)


@pytest.mark.parametrize("corrupt", ["not json", "bad digest", "no tools list"])
def test_a_corrupt_stored_listing_is_listed_anew(client: redis.Redis, corrupt: str) -> None:
    server = _time_server()
    toolset = MCPToolset("notes", [server], output_chars=1_000)
    key = toolset.key(PREFIX, server)
    tools = [_listed("made_up").as_json()]
    value = {
        "not json": "{not json",
        "bad digest": json.dumps({"digest": "0123456789abcdef", "tools": tools}),
        "no tools list": json.dumps([{"digest": digest([]), "tools": []}]),
    }[corrupt]
    client.set(key, value)
    [listing] = toolset.listings(client, PREFIX)
    assert "get_current_time" in {t.name for t in listing.tools}
    assert "made_up" not in {t.name for t in listing.tools}
    assert listing.digest == digest(listing.tools)
    # ... and what was unreadable is replaced, so the next process reads it from Redis.
    assert json.loads(client.get(key) or b"")["digest"] == listing.digest


def test_a_server_whose_command_does_not_exist_cannot_be_started(
    client: redis.Redis, tmp_path: Path
) -> None:
    missing = str(tmp_path / "no-such-mcp-server")
    toolset = MCPToolset("notes", [MCPServer("ghost", command=[missing])], output_chars=1_000)
    with pytest.raises(MCPServerError) as raised:
        toolset.listings(client, PREFIX)
    message = str(raised.value)
    assert message.startswith("MCP server ghost (")
    assert "could not be started or reached" in message
    assert client.keys("*") == []  # nothing is kept of a server that never answered


def test_a_refresh_replaces_nothing_unless_every_server_answered(
    client: redis.Redis, tmp_path: Path
) -> None:
    time_server = _time_server()
    ghost = MCPServer("ghost", command=[str(tmp_path / "no-such-mcp-server")])
    toolset = MCPToolset("notes", [time_server, ghost], output_chars=1_000)
    key = toolset.key(PREFIX, time_server)
    kept = json.dumps({"digest": digest([_listed("kept")]), "tools": [_listed("kept").as_json()]})
    client.set(key, kept)
    with pytest.raises(MCPServerError, match=r"MCP server ghost .*could not be started"):
        toolset.listings(client, PREFIX, refresh=True)
    assert client.get(key) == kept.encode()
    assert client.get(toolset.key(PREFIX, ghost)) is None


def test_a_refresh_replaces_nothing_when_an_override_names_no_tool(
    client: redis.Redis,
) -> None:
    server = MCPServer("time", command=[pypi_bin("mcp-server-time")], risk={"get_tim": Risk.READ})
    toolset = MCPToolset("notes", [server], output_chars=1_000)
    key = toolset.key(PREFIX, server)
    kept = json.dumps({"digest": digest([_listed("kept")]), "tools": [_listed("kept").as_json()]})
    client.set(key, kept)
    with pytest.raises(MCPServerError, match=r"its risk names 'get_tim', which is none of its"):
        toolset.listings(client, PREFIX, refresh=True)
    assert client.get(key) == kept.encode()  # the workers go on with what they have


def test_a_server_that_never_speaks_mcp_times_out_at_its_connect_timeout(
    client: redis.Redis,
) -> None:
    server = MCPServer("mute", command=["sleep", "30"], connect_timeout=1)
    toolset = MCPToolset("notes", [server], output_chars=1_000)
    started = time.monotonic()
    try:
        with pytest.raises(MCPServerError) as raised:
            toolset.listings(client, PREFIX)
        took = time.monotonic() - started
    finally:
        # The SDK stops it in the background, unless this process ends first.
        for pid in _children("sleep"):
            os.kill(pid, signal.SIGKILL)
    assert took < 5, took
    message = str(raised.value)
    assert "MCP server mute (sleep 30)" in message
    assert "could not be started or reached: no answer within 1 s" in message
    assert client.keys("*") == []


def test_a_servers_stderr_banner_is_logged_never_written_to_this_process(
    client: redis.Redis, tmp_path: Path, capfd: pytest.CaptureFixture[str], caplog: Any
) -> None:
    caplog.set_level(logging.INFO, logger="workers.mcp.stderr")
    toolset = MCPToolset("notes", [faults(tmp_path)], output_chars=1_000)
    [listing] = toolset.listings(client, PREFIX)
    assert "wipe" in {t.name for t in listing.tools}  # (it greeted before it answered)
    banner = "faults MCP server running on stdio"  # what tests/support/mcp_faults.py greets with
    out, err = capfd.readouterr()  # file descriptors 1 and 2, which a child would inherit
    assert banner not in out + err
    said = f"MCP server faults said: {banner}; ledger in {tmp_path}"
    deadline = time.monotonic() + 10
    while said not in caplog.messages and time.monotonic() < deadline:
        time.sleep(0.05)
    assert said in caplog.messages


def test_endless_stderr_without_a_newline_is_read_in_bounded_memory() -> None:
    # A server writing 32 MB to stderr with no newline, then one more line.
    code = (
        "import sys; out = sys.stderr.buffer; piece = b'x' * 65536\n"
        "for _ in range(512): out.write(piece)\n"
        "out.write(b'\\nlast words\\n'); out.flush()"
    )
    stderr = ServerStderr("noisy")
    tracemalloc.start()
    try:
        with subprocess.Popen([sys.executable, "-c", code], stderr=stderr.errlog) as child:
            stderr.handed_over()
            assert child.wait(60) == 0
        said = stderr.last(wait_s=30)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert said == "x" * LINE_CHARS + " / last words"
    assert peak < 4 * 1024 * 1024, peak  # a chunk and a line, not the 32 MB


def test_a_server_that_cannot_start_is_reported_with_what_it_wrote_to_stderr(
    client: redis.Redis,
) -> None:
    code = (
        "import sys; print('starting', file=sys.stderr);"
        " print('\\x1b[2Jneeds TICKETS_TOKEN set', file=sys.stderr); sys.exit(3)"
    )
    server = MCPServer("tickets", command=[sys.executable, "-c", code], connect_timeout=10)
    toolset = MCPToolset("notes", [server], output_chars=1_000)
    with pytest.raises(MCPServerError) as raised:
        toolset.listings(client, PREFIX)
    message = str(raised.value)
    assert message.startswith("MCP server tickets (")
    # Its last lines, a terminal's escape shown as '?' (it must not clear the screen).
    assert message.endswith("; its stderr said: starting / ?[2Jneeds TICKETS_TOKEN set")


def test_each_tool_gets_a_call_expecting_its_listings_digest() -> None:
    a = MCPServer("a", command=["x"])
    b = MCPServer("b", url="https://b.example/mcp", timeout=7)
    a_tools = (_listed("search"), _listed("only_a", annotations={"readOnlyHint": True}))
    b_tools = (_listed("search", description="b's search"),)
    listings = [Listing(a, a_tools, digest(a_tools)), Listing(b, b_tools, digest(b_tools))]
    toolset = MCPToolset("notes", [a, b], output_chars=321)
    made = toolset.tools(listings, taken=["only_a"])
    assert [(tool.tool.name, call.server.name) for tool, call in made] == [
        ("a_search", "a"),
        ("a_only_a", "a"),
        ("b_search", "b"),
    ]
    for tool, call in made:
        listing = listings[0] if tool.server == "a" else listings[1]
        assert call.tool is tool
        assert call.server is listing.server
        assert call.expected == listing.digest
        assert call.output_chars == 321
    assert made[0][1].expected != made[2][1].expected


# --- the SDK is loaded only by an app that uses MCP ------------------------------------


def test_importing_workers_does_not_import_the_mcp_sdk() -> None:
    code = "import workers, sys; print('mcp' in sys.modules, 'workers.mcp.sessions' in sys.modules)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert done.stdout.split() == ["False", "False"]


def test_a_password_in_a_servers_url_is_masked_where_it_is_named() -> None:
    server = MCPServer("t", url="https://bot:hunter22@tickets.internal/mcp")
    assert "hunter22" not in server.where
    assert "tickets.internal/mcp" in server.where
