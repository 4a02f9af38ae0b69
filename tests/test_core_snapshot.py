"""Snapshot at any step, restore into a fresh agent, continue ⇒ the same steps as never stopping.

A "world" is a root agent plus the children its delegations started (a stack:
the newest child works, then hands its outcome to its parent as the delegate
call's result). Hypothesis writes a script of moves — model replies valid,
invalid and garbage, replies cut by the length limit and their rest, tool
results of every status in any order, plan decisions, answers, sent-back
finals, a person's messages, follow-up turns, cancels, wrong-time calls — and
the same script is played twice: straight through, and with every agent in
the world snapshotted and restored at random points. Both must give the same
steps, byte for byte, and the same final snapshots. The `loops` setup repeats
itself on purpose, so runs reach the no-progress warning, `NO_PROGRESS` and
the model-call limit.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_core import (
    Agent,
    AgentError,
    Ask,
    Attachment,
    Config,
    DataError,
    Done,
    Kind,
    Plan,
    Question,
    Risk,
    Run,
    Skill,
    SnapshotError,
    Specialist,
    Step,
    Stop,
    Summarize,
    Tool,
    ToolOutput,
    UsageError,
)
from agent_core.state import VERSION, Snapshot, Summarizing, dump, load
from tests.support import snapshots_v1
from tests.support.scripted import batch, call, final, finish_batch, plan

TOOLS = [
    Tool("read_file", "Read a text file").arg("path", Kind.TEXT).risk(Risk.READ),
    Tool("write_file", "Write a text file")
    .arg("path", Kind.TEXT)
    .arg("text", Kind.TEXT)
    .risk(Risk.WRITE),
    Tool("pay", "Pay an invoice")
    .arg("amount", Kind.NUMBER)
    .opt("memo", Kind.TEXT)
    .risk(Risk.MONEY),
]
SKILLS = [
    Skill(name=f"skill-{n}", description=f"How to do {n}", body=f"Step one of {n}.\nStep two.")
    for n in ("csv", "pdf", "mail", "math", "maps", "code", "chat")
]
SPECIALISTS = [
    Specialist("reader", "Reads files and reports")
    .tools(["read_file"])
    .instructions("Quote exactly."),
    Specialist("manager", "Reads and writes files")
    .tools(["read_file", "write_file"])
    .instructions("Delegate reading when you can."),
]
PHOTO = Attachment("photo.png", "image/png", bytes(range(256)))


# --- the setups the property runs over -----------------------------------------------------------


@dataclass(frozen=True)
class Setup:
    config: Config
    build: Callable[[Config], Agent]
    progress: tuple[int, ...]
    """Indexes of `REPLIES` that move a run of this setup on."""
    attachments: tuple[Attachment, ...] = ()
    echo: bool = False
    """Tools and people give the same answer every time (so calls repeat exactly)."""


def _plain(config: Config) -> Agent:
    return Agent(config, TOOLS)


def _everything(config: Config) -> Agent:
    return (
        Agent(config, TOOLS)
        .with_questions()
        .with_memory([f"note {n}: " + "m" * (n * 20) for n in range(25)])
        .with_skills(SKILLS)
        .with_specialists(SPECIALISTS)
    )


def _delegating(config: Config) -> Agent:
    return Agent(config, TOOLS).with_specialists(SPECIALISTS)


BASIC = (2, 2, 3, 4, 7, 9, 10, 18)
SETUPS = {
    "plain": Setup(Config(max_calls=10), _plain, BASIC),
    "batches": Setup(Config(max_batch=3, max_calls=9), _plain, BASIC),
    "summaries": Setup(
        Config(require_plan=False, summarize=True, history_chars=1_000, max_batch=2, max_calls=30),
        _plain,
        (2, 3, 4, 7, 7, 18, 9),
    ),
    "extras": Setup(
        Config(max_batch=2, max_calls=12),
        _everything,
        (*BASIC, 8, 11, 11, 12, 13, 14, 15, 16, 17),
        (PHOTO,),
    ),
    "delegations": Setup(
        Config(require_plan=False, max_batch=2, max_calls=8), _delegating, (2, 3, 7, 8, 15, 16, 9)
    ),
    "loops": Setup(
        Config(require_plan=False, max_repeats=2, max_batch=2, max_calls=40, max_model_calls=14),
        _everything,
        (2, 2, 2, 2, 3, 3, 12, 12, 11, 7, 9),
        echo=True,
    ),
}


# --- moves: each resolved against the step the working agent waits on ---------------------------

REPLIES = [
    plan("Read notes.txt", "Write backup.txt"),
    plan(*[f"step {n}" for n in range(12)]),
    call("read_file", path="notes.txt"),
    call("write_file", path="backup.txt", text="hello"),
    call("pay", amount="12.50"),
    call("read_file"),
    call("no_such_tool", x=1),
    batch(
        ("read_file", {"path": "a"}),
        ("write_file", {"path": "b", "text": "c"}),
        ("read_file", {"path": "d"}),
    ),
    batch(("delegate", {"specialist": "reader", "task": "Read a"}), ("read_file", {"path": "e"})),
    final("Done."),
    final("Done with data.", files=["backup.txt"], ok=True),
    '{"ask_user": "Which folder?"}',
    call("remember", note="The user likes backups in /bak"),
    call("use_skill", name="skill-csv"),
    call("use_skill", name="skill-nope"),
    call("delegate", specialist="reader", task="Read notes.txt and quote it"),
    call("delegate", specialist="manager", task="Copy notes.txt"),
    call("delegate", specialist="ghost", task="Boo"),
    '<think>{"final": "decoy"}</think>```json\n{"tool": "read_file", "args": {"path": "x"}}\n```',
    batch(("remember", {"note": "n"}), ("read_file", {"path": "x"})),
    '{"tools": [{"tool": "ask_user", "args": {}}]}',
    "I will now read the file.",
]
OUTPUTS: list[Callable[[str], ToolOutput]] = [
    ToolOutput.ok,
    ToolOutput.error,
    ToolOutput.declined,
    ToolOutput.unknown,
]
ECHOES: dict[str, Callable[[str], ToolOutput]] = {
    "write_file": ToolOutput.error,
    "pay": ToolOutput.declined,
}
"""What each tool answers in an echoing setup (others: ok)."""


@dataclass(frozen=True)
class Next:
    """The right kind of answer to whatever the working agent waits on, chosen by `choice`."""

    choice: int

    def play(self, world: World) -> Step:
        agent, choice = world.agent, self.choice
        step = agent.resume()
        if isinstance(step, Ask):
            return agent.reply(self._reply(world, step))
        if isinstance(step, Summarize):
            return Model(choice).play(world)
        if isinstance(step, Run):
            return Result(choice, 0 if choice % 3 else choice // 3, choice * 7 % 450).play(world)
        return self._person(world, step)

    def _reply(self, world: World, step: Ask) -> str:
        rest = _rest(step)
        if rest is not None and self.choice % 3:
            return rest
        if "Reply now with your plan" in step.request.prompt and self.choice % 5:
            return REPLIES[0]
        progress = world.setup.progress
        return REPLIES[progress[self.choice % len(progress)]]

    def _person(self, world: World, step: Step) -> Step:
        agent = world.agent
        match step:
            case Plan():
                return agent.approve_plan(self.choice % 20 != 0)
            case Question():
                return agent.answer(_answer(self.choice, world))
            case Done(outcome) if outcome.stop is Stop.DONE and self.choice % 4:
                return agent.reject_final(f"Problem {self.choice}")
            case Done() if self.choice % 3 == 0:
                return agent.follow_up(f"Now also copy notes-{self.choice}.txt")
        return step


SO_FAR, CUT_HERE = "--- your reply so far ---\n", "\n--- cut off here ---"


def _rest(step: Step) -> str | None:
    """Return the rest of the menu reply the model was cut off in, if it is asked for it."""
    if not isinstance(step, Ask) or SO_FAR not in step.request.prompt:
        return None
    prompt = step.request.prompt
    start = prompt.index(SO_FAR) + len(SO_FAR)
    partial = prompt[start : prompt.index(CUT_HERE, start)]
    whole = next((r for r in REPLIES if r.startswith(partial) and len(r) > len(partial)), None)
    return None if whole is None else whole[len(partial) :]


def _answer(choice: int, world: World) -> str:
    return "Answer" if world.setup.echo else f"Answer {choice}"


@dataclass(frozen=True)
class Model:
    """The model answers the current request with any menu reply (or a summary)."""

    choice: int

    def play(self, world: World) -> Step:
        agent = world.agent
        if isinstance(agent.resume(), Summarize):
            text = "" if self.choice % 7 == 0 else f"Summary {self.choice}: read and wrote files."
            return agent.reply(text)
        return agent.reply(REPLIES[self.choice % len(REPLIES)])


@dataclass(frozen=True)
class Garbage:
    text: str

    def play(self, world: World) -> Step:
        return world.agent.reply(self.text)


@dataclass(frozen=True)
class Fail:
    error: str

    def play(self, world: World) -> Step:
        return world.agent.fail(self.error)


@dataclass(frozen=True)
class Person:
    """A person decides on a plan, answers a question or sends a final back."""

    choice: int

    def play(self, world: World) -> Step:
        agent = world.agent
        match agent.resume():
            case Plan():
                return agent.approve_plan(self.choice != 0)
            case Question():
                return agent.answer(_answer(self.choice, world))
            case Done(outcome) if outcome.stop is Stop.DONE and self.choice % 2 == 0:
                return agent.reject_final(f"Problem {self.choice}")
            case _:  # the wrong time: harmless
                return agent.answer("nobody asked") if self.choice % 2 else agent.approve_plan(True)


@dataclass(frozen=True)
class Result:
    """The `choice`-th call still waiting finishes; a delegate call starts a child instead."""

    choice: int
    status: int
    length: int

    def play(self, world: World) -> Step:
        agent = world.agent
        step = agent.resume()
        if not isinstance(step, Run):
            return agent.result(f"call-{self.choice % 4}", ToolOutput.ok("stray"))
        waiting = [step.call, *agent.queued()]
        picked = waiting[self.choice % len(waiting)]
        if picked.tool == "delegate":
            return world.push(agent.start_child(picked), picked.id)
        if world.setup.echo:  # the same answer for the same tool, whatever the move
            echoed = ECHOES.get(picked.tool, ToolOutput.ok)
            return agent.result(picked.id, echoed(f"{picked.tool} said the same"))
        text = f"{picked.tool} said {self.choice} " + "x" * self.length
        return agent.result(picked.id, OUTPUTS[self.status % len(OUTPUTS)](text))


@dataclass(frozen=True)
class Stray:
    """A result nobody waits for: an unknown id, or a call already answered."""

    call_id: str

    def play(self, world: World) -> Step:
        return world.agent.result(self.call_id, ToolOutput.ok("late"))


@dataclass(frozen=True)
class Cancel:
    def play(self, world: World) -> Step:
        return world.agent.cancel("enough")


@dataclass(frozen=True)
class Tell:
    """A person sends a message, at any time."""

    text: str

    def play(self, world: World) -> Step:
        return world.agent.tell(self.text)


@dataclass(frozen=True)
class FollowUp:
    """A person asks for more, at any time (it starts a turn only once the agent is done)."""

    choice: int

    def play(self, world: World) -> Step:
        return world.agent.follow_up(
            f"Follow-up {self.choice}: now back up notes-{self.choice}.txt"
        )


@dataclass(frozen=True)
class Cut:
    """The model's reply stops at the length limit after `at` characters.

    A menu reply is cut, or, when the agent asks for the rest of one, that rest.
    """

    choice: int
    at: int

    def play(self, world: World) -> Step:
        agent = world.agent
        rest = _rest(agent.resume())
        text = rest if rest is not None else REPLIES[self.choice % len(REPLIES)]
        return agent.reply(text[: self.at % (len(text) + 1)], truncated=True)


Move = Next | Model | Garbage | Fail | Person | Result | Stray | Cancel | Tell | FollowUp | Cut

NEXT = st.builds(Next, st.integers(0, 1_000))
MOVES = st.lists(
    st.one_of(
        *[NEXT] * 8,
        st.builds(Model, st.integers(0, 200)),
        st.builds(Result, st.integers(0, 10), st.integers(0, 7), st.integers(0, 450)),
        st.builds(Person, st.integers(0, 20)),
        st.builds(Garbage, st.text(max_size=30))
        | st.builds(Fail, st.sampled_from(["timeout", "HTTP 503", ""])),
        st.builds(Stray, st.sampled_from(["call-1", "call-2", "call-99", ""])),
        st.integers(0, 9).map(lambda n: Cancel() if n == 0 else Next(n)),
        st.builds(Tell, st.sampled_from(["Use the March figures", "", "  ", "y" * 2_500])),
        st.builds(FollowUp, st.integers(0, 20)),
        st.builds(Cut, st.integers(0, 200), st.integers(0, 300)),
        st.builds(Cut, st.integers(0, 200), st.integers(0, 300)),
    ),
    min_size=20,
    max_size=100,
)


# --- the world: a root agent and the children working for it -------------------------------------


@dataclass
class Frame:
    agent: Agent
    serves: str | None
    """The parent's delegate call this child works for (None for the root)."""
    start: str = ""
    """What its start set (`Agent.snapshot_start`), as it was then: a host stores it
    once, so no later move may change it."""


@dataclass
class World:
    setup: Setup
    frames: list[Frame] = field(default_factory=list)
    log: list[tuple[int, dict[str, Any]]] = field(default_factory=list)

    @classmethod
    def begin(cls, setup: Setup) -> World:
        root = setup.build(setup.config)
        world = cls(setup, [Frame(root, None)])
        step = root.start_with(
            "Copy notes.txt to backup.txt", "Files: notes.txt", setup.attachments
        )
        world.frames[0].start = root.snapshot_start()
        world.record(step)
        return world

    @property
    def agent(self) -> Agent:
        return self.frames[-1].agent

    def record(self, step: Step) -> None:
        self.log.append((len(self.frames), step.model_dump()))

    def push(self, child: Agent, serves: str) -> Step:
        self.frames.append(Frame(child, serves, child.snapshot_start()))
        return child.resume()

    def play(self, move: Move) -> None:
        step = move.play(self)
        self.record(step)
        while isinstance(step, Done) and len(self.frames) > 1:
            child = self.frames.pop()
            assert child.serves is not None
            outcome = step.outcome
            output = (
                ToolOutput.ok(outcome.summary)
                if outcome.stop is Stop.DONE
                else ToolOutput.error(f"{outcome.stop.label()}: {outcome.summary}")
            )
            step = self.agent.result(child.serves, output)
            self.record(step)

    def reload(self) -> None:
        """Snapshot every agent in the world and carry on with fresh restored ones."""
        for frame in self.frames:
            saved = frame.agent.snapshot()
            restored = Agent.restore(self.setup.config, TOOLS, saved)
            assert restored.snapshot() == saved
            assert restored.resume() == frame.agent.resume()
            assert restored.queued() == frame.agent.queued()
            frame.agent = restored

    def snapshots(self) -> list[str]:
        for frame in self.frames:  # (every move, a second start, follow-ups: none changed it)
            assert frame.agent.snapshot_start() == frame.start
        return [frame.agent.snapshot() for frame in self.frames]


PROPERTY = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("name", SETUPS)
@PROPERTY
@given(moves=MOVES, cuts=st.sets(st.integers(0, 100), max_size=3))
def test_snapshot_restore_continue_gives_the_same_steps(
    name: str, moves: list[Move], cuts: set[int]
) -> None:
    setup = SETUPS[name]
    straight = World.begin(setup)
    for move in moves:
        straight.play(move)

    stopped = World.begin(setup)
    for index, move in enumerate(moves):
        if index in cuts:
            stopped.reload()
        stopped.play(move)
    if len(moves) in cuts:
        stopped.reload()

    assert stopped.log == straight.log
    assert stopped.snapshots() == straight.snapshots()


def _reach(setup: Setup, wanted: Callable[[World], bool], moves: list[Move]) -> World:
    world = World.begin(setup)
    for move in moves:
        if wanted(world):
            break
        world.play(move)
    assert wanted(world), f"the script never reached the wanted step: {world.agent.resume()!r}"
    return world


def _continue_both(world: World, moves: list[Move]) -> None:
    """Play `moves` on `world` and on a copy restored from snapshots; both must agree."""
    copy = World(world.setup, [Frame(f.agent, f.serves, f.start) for f in world.frames], [])
    copy.reload()
    for move in moves:
        world.play(move)
        copy.play(move)
    assert copy.log == world.log[-len(copy.log) :]
    assert copy.snapshots() == world.snapshots()


# --- named places a snapshot must resume at ------------------------------------------------------

CONTINUE = [Model(n) for n in range(40)] + [Result(0, 0, 10), Person(1), Model(9)] * 5


def test_a_snapshot_mid_batch_resumes_there() -> None:
    agent = Agent(SETUPS["batches"].config, TOOLS)
    agent.start("t")
    agent.reply(plan("a", "b"))
    agent.approve_plan(True)
    step = agent.reply(REPLIES[7])
    agent.result("call-2", ToolOutput.declined("no"))
    restored = Agent.restore(SETUPS["batches"].config, TOOLS, agent.snapshot())
    assert isinstance(step, Run)
    assert restored.resume() == agent.resume()
    assert [c.id for c in restored.queued()] == ["call-3"]
    assert finish_batch(restored, restored.resume()) == finish_batch(agent, agent.resume())
    assert restored.snapshot() == agent.snapshot()


def test_a_snapshot_at_a_question_resumes_there() -> None:
    setup = SETUPS["extras"]
    world = _reach(
        setup, lambda w: isinstance(w.agent.resume(), Question), [Model(0), Person(1), Model(11)]
    )
    assert world.agent.resume() == Question(text="Which folder?")
    _continue_both(world, [Person(3), Model(2), Result(0, 0, 5), Model(9)])


def test_a_snapshot_at_a_summary_resumes_there() -> None:
    setup = SETUPS["summaries"]
    feed: list[Move] = [Model(7), Result(0, 0, 400), Result(0, 0, 400), Result(0, 0, 400)] * 3
    world = _reach(setup, lambda w: isinstance(w.agent.resume(), Summarize), feed)
    _continue_both(world, [Model(1), Model(2), Result(0, 0, 400), Model(9)])


def test_a_snapshot_of_a_child_mid_run_resumes_there() -> None:
    setup = SETUPS["delegations"]
    world = _reach(setup, lambda w: len(w.frames) == 2, [Model(16), Result(0, 0, 0)])
    world.play(Model(2))  # the child calls read_file
    assert isinstance(world.agent.resume(), Run)
    _continue_both(world, [Result(0, 0, 9), Model(9), Model(9)])


def test_a_snapshot_of_a_grandchild_resumes_there() -> None:
    setup = SETUPS["delegations"]
    world = _reach(
        setup,
        lambda w: len(w.frames) == 3,
        [Model(16), Result(0, 0, 0), Model(15), Result(0, 0, 0)],
    )
    assert "reader" in world.agent.resume().request.system  # type: ignore[union-attr]
    _continue_both(world, [Model(2), Result(0, 0, 1), Model(9), Model(9), Model(9)])


def test_attachments_and_setup_survive_a_snapshot() -> None:
    setup = SETUPS["extras"]
    world = World.begin(setup)
    saved = world.agent.snapshot()
    restored = Agent.restore(setup.config, TOOLS, saved)
    step = restored.resume()
    assert isinstance(step, Ask)
    assert step.request.attachments == (PHOTO,)
    assert step.request.attachments[0].data == bytes(range(256))
    assert "- delegate:" in step.request.system
    assert "skill-csv" in step.request.system
    assert "ask_user" in step.request.system
    assert "note 24:" in step.request.prompt


# --- a run that loops, is steered, cut off and followed up, cut at every move ---------------------

LOOPING: list[Move] = [
    Tell("Use the March figures"),
    *[Next(0), Next(0)],  # read notes.txt; its result (the message moves into history)
    *[Cut(2, 20), Next(1), Next(0)],  # the same read, cut off and continued: a warning
    *[Next(0), Next(0), Next(0), Next(0)],  # the fourth time: NO_PROGRESS
    FollowUp(3),
    *[Next(4), Next(0), Garbage("nope"), Next(4), Next(0)],  # the same failing write: warned
    *[Tell("Round to cents"), Garbage("no"), Next(8), Person(1), Garbage("x")],
    *[Next(6), Next(7), Garbage("y"), Next(4), Next(0), Next(8), Person(2), Garbage("z")],
    *[Next(7), Next(4)],  # the last model call asks for a call: MODEL_CALL_LIMIT
    *[FollowUp(5), Next(0), Person(0)],
]


def _play(moves: list[Move], cut_at: int | None = None) -> World:
    world = World.begin(SETUPS["loops"])
    for index, move in enumerate(moves):
        if index == cut_at:
            world.reload()
        world.play(move)
    if cut_at == len(moves):
        world.reload()
    return world


def test_the_looping_script_reaches_every_new_place() -> None:
    world = _play(LOOPING)
    stops = [Stop(step["outcome"]["stop"]) for _depth, step in world.log if step["kind"] == "done"]
    assert stops == [Stop.NO_PROGRESS, Stop.MODEL_CALL_LIMIT]
    kinds = [e.kind for e in world.agent.trace()]
    assert kinds.count("warning") == 2
    assert kinds.count("message") == 2
    assert kinds.count("follow_up") == 2
    assert kinds.count("continued") == 1


@pytest.mark.parametrize("cut_at", range(len(LOOPING) + 1))
def test_a_looping_run_cut_at_any_move_gives_the_same_steps(cut_at: int) -> None:
    straight = _play(LOOPING)
    stopped = _play(LOOPING, cut_at)
    assert stopped.log == straight.log
    assert stopped.snapshots() == straight.snapshots()


# --- snapshots written by version 1 ---------------------------------------------------------------

V1 = {
    "rich": (snapshots_v1.RICH, snapshots_v1.RICH_STEP, SETUPS["extras"].config),
    "summarizing": (
        snapshots_v1.SUMMARIZING,
        snapshots_v1.SUMMARIZING_STEP,
        SETUPS["summaries"].config,
    ),
    "finished": (snapshots_v1.FINISHED, snapshots_v1.FINISHED_STEP, Config(max_batch=2)),
    "main rich": (snapshots_v1.MAIN_RICH, snapshots_v1.MAIN_RICH_STEP, SETUPS["extras"].config),
    "main reading": (
        snapshots_v1.MAIN_READING,
        snapshots_v1.MAIN_READING_STEP,
        Config(require_plan=False),
    ),
}


def _holds(new: Any, old: Any) -> bool:
    """Return whether `new` holds all of `old`: the same values, maybe with more keys."""
    if isinstance(old, dict):
        return isinstance(new, dict) and all(k in new and _holds(new[k], v) for k, v in old.items())
    if isinstance(old, list):
        return isinstance(new, list) and len(new) == len(old) and all(map(_holds, new, old))
    return bool(new == old)


@pytest.mark.parametrize("name", V1)
def test_a_version_1_snapshot_restores_where_it_left_off(name: str) -> None:
    saved, step, config = V1[name]
    agent = Agent.restore(config, TOOLS, saved)
    assert agent.resume().model_dump_json() == step
    upgraded = json.loads(agent.snapshot())
    assert upgraded["version"] == VERSION
    assert _holds(upgraded["state"], json.loads(saved)["state"])  # nothing was lost
    assert not _holds(upgraded["state"], {"task": "something else"})
    again = Agent.restore(config, TOOLS, agent.snapshot())
    assert again.snapshot() == agent.snapshot()


V1_GO_ON: dict[str, list[Move]] = {
    "rich": [Result(0, 0, 5), Model(2), Result(0, 1, 5), Model(9), Person(0), Model(9)],
    "summarizing": [Model(1), Model(2), Result(0, 0, 5), Model(9)],
    "finished": [FollowUp(1), Model(2), Result(0, 0, 5), Model(9)],
    "main rich": [Result(0, 0, 5), Model(2), Result(0, 1, 5), Model(9), Person(0), Model(9)],
    "main reading": [Result(0, 0, 5), Tell("Only the travel form"), Model(2), Result(0, 0, 5)],
}


@pytest.mark.parametrize("name", V1)
def test_a_version_1_snapshot_goes_on_like_its_upgraded_copy(name: str) -> None:
    saved, _step, config = V1[name]
    setup = Setup(config, _plain, BASIC)
    restored = Agent.restore(config, TOOLS, saved)
    old = World(setup, [Frame(restored, None, restored.snapshot_start())])
    again = Agent.restore(config, TOOLS, old.agent.snapshot())
    new = World(setup, [Frame(again, None, again.snapshot_start())])
    for move in V1_GO_ON[name]:
        old.play(move)
        new.play(move)
    assert old.log == new.log
    assert old.snapshots() == new.snapshots()
    assert len({repr(step) for _depth, step in old.log}) > 2  # it went somewhere


# --- refusing what is not a snapshot -------------------------------------------------------------


def _rich_snapshot() -> str:
    setup = SETUPS["extras"]
    world = World.begin(setup)
    moves: list[Move] = [Model(0), Person(1), Model(12), Model(13), Model(11), Person(2), Model(7)]
    for move in moves:
        world.play(move)
    world.play(Result(1, 1, 30))
    assert isinstance(world.agent.resume(), Run)
    return world.agent.snapshot()


RICH = _rich_snapshot()
RICH_CONFIG = SETUPS["extras"].config


def _with(path: list[str | int], value: Any) -> str:
    data = json.loads(RICH)
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return json.dumps(data)


def _without(path: list[str | int]) -> str:
    data = json.loads(RICH)
    node = data
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return json.dumps(data)


NOT_SNAPSHOTS: dict[str, object] = {
    "empty": "",
    "blank": " \n\t ",
    "none": None,
    "number": 42,
    "dict": {"format": "relay.agent"},
    "list": ["x"],
    "json null": "null",
    "json list": "[1, 2]",
    "json string": '"relay.agent"',
    "empty object": "{}",
    "other shape": '{"task": "x", "phase": {"kind": "asking"}}',
    "celery message": json.dumps({"task": "relay.advance", "id": "x", "args": ["r"], "kwargs": {}}),
    "no version": json.dumps({"format": "relay.agent", "state": {}}),
    "no format": json.dumps({"version": 1, "state": {}}),
    "wrong format": _with(["format"], "other.agent"),
    "version 5": _with(["version"], 5),
    "version 1 with an unknown phase": snapshots_v1.FINISHED.replace(
        '"kind":"finished"', '"kind":"dreaming"'
    ),
    "version 0": _with(["version"], 0),
    "version as text": _with(["version"], "1"),
    "extra top key": _with(["extra"], 1),
    "state is a list": _with(["state"], []),
    "unknown phase": _with(["state", "phase", "kind"], "dreaming"),
    "results for unknown ids": _with(
        ["state", "phase", "results"], {"call-99": {"status": "ok", "text": "x"}}
    ),
    "empty batch": _with(["state", "phase", "batch"], []),
    "bad output status": _with(
        ["state", "phase", "results", "call-x"], {"status": "maybe", "text": ""}
    ),
    "negative calls": _with(["state", "calls_used"], -1),
    "bad attachment bytes": _with(["state", "attachments", 0, "data"], "%%% not base64 %%%"),
    "unknown history entry": _with(["state", "history"], [{"kind": "dream"}]),
    "fold beyond history": _with(["state", "phase"], {"kind": "summarizing", "fold": 5}),
    "truncated": RICH[: len(RICH) // 2],
    "truncated by one": RICH[:-1],
    "not utf-8 bytes": b"\xff\xfe\x00",
    "deep nesting": "[" * 100_000,
    "lone surrogate": RICH.replace('"Copy', '"\ud800Copy', 1),
    "no state": _without(["state"]),
    "call without an id": _without(["state", "phase", "batch", 0, "id"]),
    # Attachment and Specialist define their own positional __init__, which
    # pydantic calls while loading JSON: a missing or extra field must still be
    # a SnapshotError, not a TypeError.
    "attachment without a name": _without(["state", "attachments", 0, "name"]),
    "attachment with an extra key": _with(["state", "attachments", 0, "size"], 3),
    "specialist without a description": _without(["state", "specialists", 0, "description"]),
    "specialist with an extra key": _with(["state", "specialists", 0, "age"], 3),
}


@pytest.mark.parametrize("saved", NOT_SNAPSHOTS.values(), ids=NOT_SNAPSHOTS.keys())
def test_what_is_not_a_snapshot_raises_snapshot_error(saved: Any) -> None:
    with pytest.raises(SnapshotError) as raised:
        Agent.restore(RICH_CONFIG, TOOLS, saved)
    assert isinstance(raised.value, DataError)
    assert isinstance(raised.value, AgentError)
    assert str(raised.value)


def test_the_rich_snapshot_itself_restores() -> None:
    agent = Agent.restore(RICH_CONFIG, TOOLS, RICH)
    assert isinstance(agent.resume(), Run)
    assert agent.snapshot() == RICH


def test_a_running_state_with_every_result_in_is_refused() -> None:
    # A batch whose every call has its result is not a state the agent can be in:
    # restoring one must be refused, not fail later in resume().
    data = json.loads(RICH)
    phase = data["state"]["phase"]
    phase["results"] = {c["id"]: {"status": "ok", "text": "x"} for c in phase["batch"]}
    with pytest.raises(SnapshotError, match="one must still be due"):
        Agent.restore(RICH_CONFIG, TOOLS, json.dumps(data))


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, value in node.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += _paths(value, (*prefix, index))
    return found


RICH_PATHS = _paths(json.loads(RICH))
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 1_000) | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)


def _assert_usable_or_refused(saved: str) -> None:
    """Restoring gives SnapshotError, or an agent whose every method behaves."""
    try:
        agent = Agent.restore(RICH_CONFIG, TOOLS, saved)
    except SnapshotError:
        return
    try:
        step = agent.resume()
    except UsageError:  # a valid snapshot of an agent not yet started
        return
    assert isinstance(step, Ask | Plan | Run | Question | Summarize | Done)
    agent.snapshot().encode("utf-8")
    agent.queued()
    for each in [*agent.queued(), *([step.call] if isinstance(step, Run) else [])]:
        agent.result(each.id, ToolOutput.ok("x"))
    agent.reply("garbage")
    agent.cancel("stop")
    assert isinstance(agent.resume(), Done)


# These two found the Attachment/Specialist TypeError above within a few hundred examples.
MUTATE = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@MUTATE
@given(
    start=st.integers(0, len(RICH)),
    drop=st.integers(0, 40),
    insert=st.text(max_size=10) | st.sampled_from(['"', "{", "}", "[", "]", ",", ":", "\\", "0"]),
)
def test_mutated_text_is_restored_or_refused(start: int, drop: int, insert: str) -> None:
    _assert_usable_or_refused(RICH[:start] + insert + RICH[start + drop :])


@MUTATE
@given(data=st.data())
def test_mutated_values_are_restored_or_refused(data: st.DataObject) -> None:
    tree = json.loads(RICH)
    path = data.draw(st.sampled_from(RICH_PATHS))
    node = tree
    for key in path[:-1]:
        node = node[key]
    if data.draw(st.booleans()) and isinstance(node, dict):
        del node[path[-1]]
    else:
        node[path[-1]] = data.draw(JSON_VALUES)
    _assert_usable_or_refused(json.dumps(tree))


def test_a_snapshot_stays_valid_json_with_a_format_tag() -> None:
    tree = json.loads(RICH)
    assert tree["format"] == "relay.agent"
    assert tree["version"] == VERSION
    assert set(tree) == {"format", "version", "state"}


def test_the_head_and_the_history_entries_make_the_snapshot() -> None:
    agent = Agent.restore(Config(), TOOLS, snapshots_v1.RICH)
    head = json.loads(agent.snapshot_head())
    whole = json.loads(agent.snapshot())
    assert "history" not in head["state"]
    entries = [json.loads(entry.model_dump_json()) for entry in agent.history()]
    assert entries == whole["state"].pop("history")
    assert len(entries) == 3
    # The head leaves out the state's fields that hold their default (and only those).
    defaults = json.loads(Agent(Config(), TOOLS).snapshot())["state"]
    left_out = {k: v for k, v in whole["state"].items() if k not in head["state"]}
    assert left_out == {k: defaults[k] for k in left_out}
    assert {"sent_back_early", "summary", "problem"} <= left_out.keys()
    assert {k: v for k, v in whole["state"].items() if k in head["state"]} == head["state"]
    restored = Agent.restore(Config(), TOOLS, agent.snapshot_head())
    assert json.loads(restored.snapshot())["state"] == {**whole["state"], "history": []}


def test_a_copy_goes_on_alone_and_keeps_unchanged_entries_as_the_same_objects() -> None:
    agent = Agent(Config(require_plan=False), TOOLS)
    agent.start("read a")
    agent.reply(call("read_file", path="a"))
    step = agent.resume()
    assert isinstance(step, Run)
    agent.result(step.call.id, ToolOutput.ok("text of a"))
    twin = agent.copy()
    before = twin.history()
    twin.reply(call("read_file", path="b"))
    step = twin.resume()
    assert isinstance(step, Run)
    twin.result(step.call.id, ToolOutput.ok("text of b"))
    assert agent.history() == before  # the original did not move
    grown = twin.history()
    assert len(grown) == len(before) + 1
    assert all(new is old for new, old in zip(grown, before, strict=False))


@pytest.mark.parametrize("summarize", [False, True], ids=["trimmed", "summarized"])
def test_the_snapshot_text_is_the_whole_snapshot_dumped_at_every_step(summarize: bool) -> None:
    config = Config(require_plan=False, history_chars=1_000, max_calls=10_000, summarize=summarize)
    agent = Agent(config, TOOLS)
    step = agent.start("read every file")
    states = [load(saved) for saved in (RICH, snapshots_v1.SUMMARIZING)]
    for n in range(60):
        if isinstance(step, Summarize):
            step = agent.reply(f"summary {n}")
        elif isinstance(step, Ask):
            step = agent.reply(call("read_file", path=f"f{n}"))
        else:
            assert isinstance(step, Run)
            step = agent.result(step.call.id, ToolOutput.ok("x" * 200))
        states.append(load(agent.snapshot()))
    for state in states:
        whole = Snapshot(format="relay.agent", version=VERSION, state=state).model_dump_json()
        assert dump(state) == whole
    assert any(isinstance(s.phase, Summarizing) for s in states[2:]) is summarize


def _with_seen_calls(calls: int) -> Agent:
    agent = Agent(Config(require_plan=False, max_calls=10_000), TOOLS)
    step = agent.start("read every file")
    for n in range(calls):
        step = agent.reply(call("read_file", path=f"f{n}"))
        assert isinstance(step, Run)
        step = agent.result(step.call.id, ToolOutput.ok(f"text {n}"))
    return agent


def test_seen_calls_are_saved_as_one_short_text() -> None:
    agent = _with_seen_calls(70)
    saved = json.loads(agent.snapshot())
    assert saved["version"] == VERSION == 4
    seen = saved["state"]["loops"]["seen"]
    assert isinstance(seen, str)
    assert len(seen.split()) == 64
    # 8 characters of base64url each, a count of 1 left out: 9 bytes a call, with its space.
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{8}", key) for key in seen.split())
    assert len(seen) == 64 * 9 - 1
    state = load(json.dumps(saved))
    assert load(dump(state)) == state
    assert state.loops == load(agent.snapshot()).loops


def _hex_digest(key: str) -> str:
    """The version 3 form of a seen call's key (16 hex digits of the same digest)."""
    return (base64.urlsafe_b64decode(key) + b"\xff\xee").hex()


def test_version_3_and_2_seen_calls_count_on_after_the_upgrade() -> None:
    """A call seen before the upgrade is the same call after it: a repeat still counts."""
    agent = _with_seen_calls(3)
    step = agent.reply(call("read_file", path="f1"))  # seen once: now twice
    assert isinstance(step, Run)
    agent.result(step.call.id, ToolOutput.ok("text 1"))
    saved = json.loads(agent.snapshot())
    now = load(agent.snapshot()).loops
    assert [s.count for s in now.seen] == [1, 1, 2]
    as_v3 = " ".join(f"{_hex_digest(s.key)}:{s.count}" for s in now.seen)
    saved_v3 = {**saved, "version": 3}
    saved_v3["state"] = {**saved["state"], "loops": {**saved["state"]["loops"], "seen": as_v3}}
    assert load(json.dumps(saved_v3)).loops == now
    # A version 2 snapshot holds the same calls as a list of objects.
    as_list = [{"key": _hex_digest(s.key), "count": s.count} for s in now.seen]
    saved_v2 = {**saved, "version": 2}
    saved_v2["state"] = {**saved["state"], "loops": {**saved["state"]["loops"], "seen": as_list}}
    assert load(json.dumps(saved_v2)).loops == now
    # And the upgraded agent counts the next repeat on from 2.
    config = Config(require_plan=False, max_calls=10_000)
    upgraded = Agent.restore(config, TOOLS, json.dumps(saved_v3))
    step = upgraded.reply(call("read_file", path="f1"))
    assert isinstance(step, Run)
    upgraded.result(step.call.id, ToolOutput.ok("text 1"))
    assert load(upgraded.snapshot()).loops.seen[-1].count == 3


@pytest.mark.parametrize(
    "seen",
    [
        *("abc:", ":3", "abc:x", "abc:0", "ab+c:1", "ab/c", "abc=", "\u00e9", "abc:-1"),
        *("abc:1234567890", 7),
    ],
)
def test_a_corrupt_seen_text_is_a_snapshot_error(seen: object) -> None:
    saved = json.loads(_with_seen_calls(2).snapshot())
    saved["state"]["loops"]["seen"] = seen
    with pytest.raises(SnapshotError):
        load(json.dumps(saved))


def test_what_the_start_set_never_changes_after_it() -> None:
    """A host stores `snapshot_start` once and leaves it out of every later head."""
    agent = Agent(Config(require_plan=False), TOOLS)
    fresh = agent.snapshot_start()
    agent.start_with("copy a.txt", "a folder", [Attachment("spec.md", "text/markdown", b"spec")])
    start = agent.snapshot_start()
    assert start != fresh
    assert json.loads(start) == {
        "task": "copy a.txt",
        "context": "a folder",
        "attachments": [{"name": "spec.md", "mime": "text/markdown", "data": "c3BlYw=="}],
    }
    head = agent.snapshot_head(without_start=True)
    assert not {"task", "context", "attachments"} & set(json.loads(head)["state"])
    agent.start("something else")  # a second start changes nothing
    agent.reply('{"final": "done"}')
    agent.follow_up("and now b.txt")  # a new turn keeps the task
    assert agent.snapshot_start() == start
