"""Model protocols per route: text, a JSON schema, native function calling.

The core says what each request allows (`ModelRequest.reply`); a route speaking `json`
or `tools` sends it to a real OpenAI-compatible server on loopback, which checks what
it was sent and answers in kind; what comes back is fed to a real agent, so the core
is seen to read it unchanged. A server that refuses the protocol is spoken to in text,
and the route's state in a private Redis says so.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from click.testing import CliRunner

from agent_core import Agent, Ask, Config, Done, Kind, Plan, Risk, Run, Summarize, Tool, ToolOutput
from agent_core.reply import CallReply, FinalReply, Unusable, parse_reply
from agent_core.steps import ModelRequest, OfferedTool, ReplyShape
from tests.support.clients import opened
from tests.support.model_server import ChatCall, ModelServer, Reply, scripted
from tests.support.redis_server import RedisServer
from workers import ModelRoute
from workers.cli import cli
from workers.loop import run_blocking
from workers.model.limits import RouteLimits
from workers.model.protocols import FunctionCall, functions, reply_schema, reply_text
from workers.model.router import ModelRouter
from workers.model.transport import ModelClient
from workers.model.wire import chat_body
from workers.settings import ModelProtocol, ModelSettings, now_ms
from workers.store.runs import RunStore

READ = Tool("read_file", "Read a text file").arg("path", Kind.TEXT, "relative path").risk(Risk.READ)
WRITE = Tool("write_file", "Write a file").arg("path", Kind.TEXT).arg("text", Kind.TEXT)
COUNT = Tool("count", "Count to n").arg("n", Kind.INTEGER).opt("loud", Kind.BOOLEAN)
TOOLS = [READ, WRITE, COUNT]
TASK = "Copy notes.txt to backup.txt"
SUMMARY = ModelRequest(system="You keep an agent's notes short.", prompt="Fold this in.")


def _planning(**config: Any) -> tuple[Agent, Ask]:
    agent = Agent(Config(**config), TOOLS).with_questions()
    step = agent.start(TASK)
    assert isinstance(step, Ask)
    return agent, step


def _working(max_batch: int = 2) -> tuple[Agent, Ask]:
    """An agent past its plan, asking for calls (a batch of up to `max_batch`)."""
    agent = Agent(Config(max_batch=max_batch, require_plan=False), TOOLS)
    step = agent.start(TASK)
    assert isinstance(step, Ask)
    return agent, step


@contextmanager
def _client(server: ModelServer, protocol: ModelProtocol) -> Iterator[ModelClient]:
    settings = ModelSettings(url=server.url, model="m", retries=0, protocol=protocol)
    with opened(ModelClient(settings)) as client:
        yield client


def _call(tool: str, arguments: object) -> dict[str, Any]:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": f"c-{tool}", "type": "function", "function": {"name": tool, "arguments": text}}


def _problem(agent: Agent, text: str) -> str:
    """Why the agent could not use `text`, as its next prompt tells the model."""
    step = agent.reply(text)
    assert isinstance(step, Ask), step
    prompt = step.request.prompt
    assert "Your last reply could not be used:" in prompt, prompt
    return prompt.split("Your last reply could not be used:", 1)[1].split("\n", 1)[0]


# --- what the core says each request allows -------------------------------------------------


def test_the_core_allows_a_plan_first_and_calls_after_it() -> None:
    agent, step = _planning(max_batch=3, max_plan_steps=4)
    assert step.request.reply == ReplyShape(plan_steps=4, ask_user=True)
    assert isinstance(agent.reply('{"plan": ["Read", "Write"]}'), Plan)
    after = agent.approve_plan(True)
    assert isinstance(after, Ask)
    shape = after.request.reply
    assert shape is not None
    assert [t.name for t in shape.tools] == ["read_file", "write_file", "count"]
    assert shape.tools[2].args == COUNT.args
    assert (shape.plan_steps, shape.batch, shape.ask_user) == (0, 3, True)


def test_the_last_reply_may_only_be_final_and_a_summary_or_a_cut_reply_is_plain_text() -> None:
    step = Agent(Config(max_model_calls=1), TOOLS).start(TASK)
    assert isinstance(step, Ask)
    assert step.request.reply == ReplyShape()  # the final answer alone
    agent, _ = _working()
    cut = agent.reply('{"final": "half of it', truncated=True)
    assert isinstance(cut, Ask)
    assert cut.request.reply is None  # the rest is written as text
    summarizing = Agent(Config(require_plan=False, summarize=True, history_chars=1_000), TOOLS)
    step = summarizing.start(TASK)
    for turn in range(10):
        if not isinstance(step, Ask):
            break
        step = summarizing.reply(json.dumps({"tool": "read_file", "args": {"path": f"{turn}"}}))
        assert isinstance(step, Run)
        step = summarizing.result(step.call.id, ToolOutput.ok("x" * 300))
    assert isinstance(step, Summarize)
    assert step.request.reply is None


def test_a_request_without_a_shape_dumps_as_it_always_did() -> None:
    assert SUMMARY.model_dump_json() == (
        '{"system":"You keep an agent\'s notes short.","prompt":"Fold this in.","attachments":[]}'
    )
    shaped = SUMMARY.model_copy(update={"reply": ReplyShape()})
    assert json.loads(shaped.model_dump_json())["reply"]["plan_steps"] == 0


# --- the schema -------------------------------------------------------------------------------


def _valid(schema: dict[str, Any], value: object) -> bool:
    return bool(jsonschema.Draft202012Validator(schema).is_valid(value))


def test_the_schema_takes_exactly_the_replies_the_request_allows() -> None:
    _, step = _working(max_batch=2)
    assert step.request.reply is not None
    schema = reply_schema(step.request.reply)
    assert _valid(schema, {"tool": "read_file", "args": {"path": "a"}})
    assert _valid(schema, {"tool": "count", "args": {"n": 3}})
    assert _valid(schema, {"tools": [{"tool": "read_file", "args": {"path": "a"}}] * 2})
    assert _valid(schema, {"final": "done", "sources": ["a"]})  # other keys are kept
    assert not _valid(schema, {"tools": [{"tool": "read_file", "args": {"path": "a"}}] * 3})
    assert not _valid(schema, {"tool": "rm", "args": {"path": "a"}})
    assert not _valid(schema, {"tool": "count", "args": {"n": "three"}})
    assert not _valid(schema, {"tool": "read_file", "args": {}})  # path is required
    assert not _valid(schema, {"plan": ["a"]})  # the plan is settled
    assert not _valid(schema, {"ask_user": "why?"})  # questions are not enabled
    _, planning = _planning(max_plan_steps=2)
    assert planning.request.reply is not None
    plan_schema = reply_schema(planning.request.reply)
    assert _valid(plan_schema, {"plan": ["Read", "Write"]})
    assert _valid(plan_schema, {"ask_user": "Which folder?"})
    assert not _valid(plan_schema, {"plan": ["a", "b", "c"]})
    assert not _valid(plan_schema, {"tool": "read_file", "args": {"path": "a"}})


def test_the_functions_are_the_tools_then_the_forms_a_tool_name_cannot_take() -> None:
    clash = OfferedTool(name="final_answer", description="A tool of that name")
    shape = ReplyShape(plan_steps=3, tools=(clash,), ask_user=True)
    names = [f["function"]["name"] for f in functions(shape)]
    assert names == ["final_answer", "submit_plan", "ask_user", "_final_answer"]
    calls = [FunctionCall(name="_final_answer", arguments='{"final": "ok"}')]
    assert json.loads(reply_text(shape, calls, cut=False)) == {"final": "ok"}
    mine = [FunctionCall(name="final_answer", arguments="{}")]
    assert json.loads(reply_text(shape, mine, cut=False)) == {"tool": "final_answer", "args": {}}


# --- text: unchanged ---------------------------------------------------------------------------


def test_a_text_route_sends_the_same_body_as_before_whatever_the_request_allows() -> None:
    _, step = _working()
    plain = step.request.model_copy(update={"reply": None})
    with (
        ModelServer(scripted('{"final": "ok"}', '{"final": "ok"}')) as server,
        _client(server, "text") as client,
    ):
        run_blocking(client.complete(step.request))
        run_blocking(client.complete(plain))
        shaped, unshaped = server.calls
    before = chat_body("m", plain, attachment_chars=20_000, max_tokens=4096)
    assert shaped.body == unshaped.body == before
    assert not {"response_format", "tools", "tool_choice"} & set(shaped.body)


# --- json ---------------------------------------------------------------------------------------


def test_a_json_route_sends_the_schema_and_a_summary_goes_without_it() -> None:
    agent, step = _working()
    assert step.request.reply is not None
    answer = '{"tool": "read_file", "args": {"path": "notes.txt"}}'
    with (
        ModelServer(scripted(answer, "A short summary.")) as server,
        _client(server, "json") as client,
    ):
        reply = run_blocking(client.complete(step.request))
        summary = run_blocking(client.complete(SUMMARY))
        asked, summarized = server.calls
    sent = asked.body["response_format"]
    assert sent["type"] == "json_schema"
    assert sent["json_schema"]["name"] == "reply"
    assert sent["json_schema"]["schema"] == reply_schema(step.request.reply)
    assert "tools" not in asked.body
    assert not {"response_format", "tools", "tool_choice"} & set(summarized.body)
    assert summary.text == "A short summary."
    run = agent.reply(reply.text)
    assert isinstance(run, Run)
    assert run.call.args == {"path": "notes.txt"}


# --- tools ----------------------------------------------------------------------------------


def _tools_sent(call: ChatCall) -> list[str]:
    assert call.body["tool_choice"] == "required"
    assert "response_format" not in call.body
    return [entry["function"]["name"] for entry in call.body["tools"]]


def test_a_tools_route_offers_functions_and_a_batch_of_calls_comes_back_as_one() -> None:
    agent, step = _working(max_batch=2)
    calls = [_call("read_file", {"path": "a"}), _call("write_file", {"path": "b", "text": "c"})]
    with (
        ModelServer(scripted(Reply(tool_calls=calls))) as server,
        _client(server, "tools") as client,
    ):
        reply = run_blocking(client.complete(step.request))
        (sent,) = server.calls
    assert _tools_sent(sent) == ["read_file", "write_file", "count", "final_answer"]
    count = next(f for f in sent.body["tools"] if f["function"]["name"] == "count")
    assert count["function"]["parameters"]["properties"]["n"] == {"type": "integer"}
    assert count["function"]["parameters"]["required"] == ["n"]
    assert [c.name for c in reply.tool_calls] == ["read_file", "write_file"]
    parsed = parse_reply(reply.text)
    assert isinstance(parsed, CallReply)
    assert [(c.tool, c.args) for c in parsed.calls] == [
        ("read_file", {"path": "a"}),
        ("write_file", {"path": "b", "text": "c"}),
    ]
    run = agent.reply(reply.text)
    assert isinstance(run, Run)
    assert [c.tool for c in agent.queued()] == ["write_file"]


def test_streamed_tool_calls_are_put_together_from_their_pieces() -> None:
    agent, step = _working()
    answer = _call("final_answer", {"final": "Copied it", "files": ["backup.txt"]})
    pieces: list[str] = []
    with (
        ModelServer(scripted(Reply(text="", tool_calls=[answer], piece_chars=3))) as server,
        _client(server, "tools") as client,
    ):
        reply = run_blocking(client.complete(step.request, on_text=pieces.append))
        (sent,) = server.calls
    assert sent.body["stream"] is True
    assert reply.finish_reason == "tool_calls"
    assert "".join(pieces) == reply.text
    done = agent.reply(reply.text)
    assert isinstance(done, Done)
    assert done.outcome.summary == "Copied it"
    assert done.outcome.data == {"final": "Copied it", "files": ["backup.txt"]}


def test_streamed_calls_after_some_text_start_the_reply_over() -> None:
    _, step = _working()
    answer = [_call("read_file", {"path": "a"})]
    pieces: list[str] = []
    with (
        ModelServer(scripted(Reply(text="Let me look.", tool_calls=answer))) as server,
        _client(server, "tools") as client,
    ):
        reply = run_blocking(client.complete(step.request, on_text=pieces.append))
    assert reply.text == '{"tool": "read_file", "args": {"path": "a"}}'
    assert pieces[-2:] == ["", reply.text]  # RESTART, then the call as the core reads it


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize(
    ("tool_calls", "reason"),
    [
        ([_call("read_file", "{path: a")], '"args" of read_file must be a JSON object'),
        ([_call("read_file", "[1, 2]")], '"args" of read_file must be a JSON object'),
        ([_call("rm", {"path": "a"})], "there is no tool named 'rm'"),
        ({"function": {"name": "read_file"}}, '"tool" must be the name of a tool'),
        (["read_file"], '"tool" must be the name of a tool'),
        (
            [_call("read_file", {"path": "a"}), _call("final_answer", {"final": "x"})],
            'your JSON object has "tools", "final": use exactly one of them per reply',
        ),
        ([_call("final_answer", {"answer": "x"})], '"final" must be text'),
    ],
)
def test_malformed_tool_calls_are_a_reply_the_core_refuses_saying_why(
    tool_calls: object, reason: str, streamed: bool
) -> None:
    agent, step = _working()
    pieces: list[str] = []
    with (
        ModelServer(scripted(Reply(tool_calls=tool_calls))) as server,
        _client(server, "tools") as client,
    ):
        reply = run_blocking(
            client.complete(step.request, on_text=pieces.append if streamed else None)
        )
    assert reason in _problem(agent, reply.text)


def test_plain_content_from_a_tools_route_is_read_as_it_is() -> None:
    agent, step = _working()
    with (
        ModelServer(scripted('{"final": "no calls needed"}')) as server,
        _client(server, "tools") as client,
    ):
        reply = run_blocking(client.complete(step.request))
    assert reply.tool_calls == ()
    assert reply.text == '{"final": "no calls needed"}'
    assert isinstance(agent.reply(reply.text), Done)


def test_a_call_cut_by_the_length_limit_is_left_open_and_its_rest_asked_for() -> None:
    agent, step = _working()
    assert step.request.reply is not None
    cut = [FunctionCall(name="write_file", arguments='{"path": "b", "text": "lo')]
    text = reply_text(step.request.reply, cut, cut=True)
    assert text == '{"tool": "write_file", "args": {"path": "b", "text": "lo'
    rest = agent.reply(text, truncated=True)
    assert isinstance(rest, Ask)
    assert rest.request.reply is None
    run = agent.reply('ng"}}')
    assert isinstance(run, Run)
    assert run.call.args == {"path": "b", "text": "long"}
    final = [FunctionCall(name="final_answer", arguments='{"final": "half')]
    assert reply_text(step.request.reply, final, cut=True) == '{"final": "half'
    assert isinstance(parse_reply(reply_text(step.request.reply, final, cut=False)), Unusable)


def test_one_form_call_is_the_reply_itself() -> None:
    shape = ReplyShape(plan_steps=3, ask_user=True)
    for name, arguments, kind in [
        ("submit_plan", {"plan": ["a", "b"]}, "plan"),
        ("ask_user", {"ask_user": "Which?"}, "ask_user"),
        ("final_answer", {"final": "done", "n": 2}, "final"),
    ]:
        text = reply_text(
            shape, [FunctionCall(name=name, arguments=json.dumps(arguments))], cut=False
        )
        assert json.loads(text) == arguments, kind
    final = parse_reply(
        reply_text(
            shape, [FunctionCall(name="final_answer", arguments='{"final": "x"}')], cut=False
        )
    )
    assert isinstance(final, FinalReply)


# --- a server that refuses the protocol --------------------------------------------------------


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    with RedisServer(tmp_path) as server:
        yield server.url


@pytest.fixture
def limits(redis_url: str) -> RouteLimits:
    return RouteLimits(RunStore(redis_url, "relay:").connection)  # the prefix relay's own


def _router(limits: RouteLimits, route: ModelRoute, made: list[ModelClient]) -> ModelRouter:
    def client(_: ModelRoute) -> ModelClient:
        if not made:
            made.append(ModelClient(ModelSettings(url=route.url, model="m", retries=0,
                                                  protocol=route.protocol)))  # fmt: skip
        return made[0]

    return ModelRouter([route], limits, client, key_concurrency=None, lease_ms=10_000, clock=now_ms)


@pytest.mark.parametrize(
    ("protocol", "field", "status"),
    [("json", "response_format", 400), ("tools", "tools", 400), ("tools", "tool_choice", 422)],
)
def test_a_route_whose_server_refuses_its_protocol_speaks_text_from_then_on(
    limits: RouteLimits, protocol: ModelProtocol, field: str, status: int
) -> None:
    _, step = _working()
    answer = '{"tool": "read_file", "args": {"path": "a"}}'
    server = ModelServer(scripted(answer, answer), refuse_fields=(field,), refuse_status=status)
    made: list[ModelClient] = []
    with server:
        route = ModelRoute("local", url=server.url, model="m", protocol=protocol)
        router = _router(limits, route, made)
        first = run_blocking(router.complete(step.request, key="k", holder="run|1", tokens=100))
        second = run_blocking(router.complete(step.request, key="k", holder="run|2", tokens=100))
        refused, retried, later = server.calls
    assert field in refused.body
    for call in (retried, later):
        assert not {"response_format", "tools", "tool_choice"} & set(call.body)
    assert first.reply.text == second.reply.text == answer
    assert first.reply.protocol_fallback is not None
    assert f"{field} is not supported" in first.reply.protocol_fallback
    assert second.reply.protocol_fallback is None  # told once
    assert made[0].protocol_fallback == first.reply.protocol_fallback
    state = limits.state(route, now_ms())
    assert state.protocol == protocol
    assert state.protocol_fallback == first.reply.protocol_fallback
    assert (state.failures, state.circuit, state.error) == (0, "closed", "")
    run_blocking(made[0].aclose())


def test_another_400_is_no_refusal_of_the_protocol() -> None:
    _, step = _working()
    with (
        ModelServer(scripted(Reply(status=400, text="unknown model m"))) as server,
        _client(server, "json") as client,
    ):
        with pytest.raises(Exception, match="unknown model m"):
            run_blocking(client.complete(step.request))
        assert client.protocol_fallback is None
        assert len(server.calls) == 1


def test_relay_routes_shows_a_route_that_speaks_text_instead(
    limits: RouteLimits, redis_url: str, tmp_path: Path
) -> None:
    routes = [
        {"name": "local", "url": "http://127.0.0.1:9/v1", "model": "qwen", "protocol": "json"},
        {"name": "other", "url": "http://127.0.0.1:9/v1", "model": "big", "protocol": "tools"},
    ]
    path = tmp_path / "models.json"
    path.write_text(json.dumps(routes))
    local = ModelRoute("local", url="http://127.0.0.1:9/v1", model="qwen", protocol="json")
    assert limits.fell_back(local, "model server answered 400: response_format is not supported")
    assert not limits.fell_back(local, "a later refusal")  # written once
    env = {"RELAY_REDIS_URL": redis_url, "RELAY_MODELS": str(path), "RELAY_APP": "",
           "COLUMNS": "200"}  # fmt: skip
    result = CliRunner(env=env).invoke(cli, ["routes"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    lines = {line.split()[0]: line for line in result.stdout.splitlines() if line.strip()}
    assert "json → text" in lines["local"]
    assert "tools" in lines["other"]
    assert "→ text" not in lines["other"]
    assert "response_format is not supported" in result.stdout
    shown = json.loads(CliRunner(env=env).invoke(cli, ["routes", "--json"]).stdout)
    assert shown[0]["protocol_fallback"].endswith("response_format is not supported")
    assert shown[1]["protocol_fallback"] is None
