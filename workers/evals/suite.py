"""A suite for `relay eval`: plain data (TOML), read and checked before anything runs.

    [[case]]
    name = "copy"
    task = "Copy a.txt to b.txt"
    tools = ["read_note", "write_note"]   # the app's own tools, by name
    min_pass = 1.0                         # of the repeats; below it, relay eval exits 1
    expect.stop = "done"
    expect.final_contains = "b.txt"
    expect.called = ["read_note"]

A suite names the risks whose calls its cases may run (`approve = ["read",
"create"]`, at the top; none by default). A trial's run asks about every call of
another risk, whatever the case's `config.policy` says, and the eval declines it;
its trial says so. MONEY is approved only when the suite lists it and `relay eval
--allow-money` is given.

Every field is in `docs/evals.md`. A field the format does not have is refused by
name (a typo must not turn a check off), and so is a value of the wrong kind; the
error names the file, the case and the field.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from agent_core import Config, Policy, Risk, Stop
from agent_core.errors import DefinitionError
from workers.client.start import Recorded
from workers.engine.budget import Budget
from workers.errors import RelayError
from workers.evals.pattern import Pattern, PatternError

__all__ = [
    "BUILTIN_APP",
    "After",
    "Called",
    "Case",
    "Expect",
    "Suite",
    "builtin_suite",
    "builtin_suite_text",
    "load_suite",
    "read_suite",
]

BUILTIN_APP = "workers.evals.builtin:relay"
"""The app the built-in suite runs on (its offline tools); importing it builds it."""

MAX_SUITE_BYTES = 1_000_000
MAX_CASES = 1_000
MAX_DEPTH = 32
"""Tables and arrays nested deeper than this are refused (a suite needs a handful;
deeper data only exhausts the parsers' recursion)."""
_STRICT = ConfigDict(frozen=True, extra="forbid")


def _listed(value: object) -> object:
    """One text where a list of them is meant: a list of one."""
    return [value] if isinstance(value, str | dict) else value


class Called(BaseModel):
    """A tool call a check looks for: the tool, and (if given) the arguments it had,
    each given key equal (keys not given may be anything)."""

    model_config = _STRICT
    tool: str = Field(min_length=1, max_length=200)
    args: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, value: object) -> object:
        return {"tool": value} if isinstance(value, str) else value

    def matches(self, tool: str, args: dict[str, Any]) -> bool:
        if tool != self.tool:
            return False
        return self.args is None or all(args.get(k) == v for k, v in self.args.items())

    def __str__(self) -> str:
        if self.args is None:
            return self.tool
        given = ", ".join(f"{k}={v!r}" for k, v in self.args.items())
        return f"{self.tool}({given})"


class After(BaseModel):
    """A READ tool the eval calls itself once the run has ended (in its own process),
    and text its output must contain: what a notes tool must hold, say."""

    model_config = _STRICT
    tool: str = Field(min_length=1, max_length=200)
    args: dict[str, Any] = Field(default_factory=dict)
    contains: str = ""


def _risks(value: object) -> object:
    """A list of risks; the yes/no of suites before risks were named is refused with a hint."""
    if value in ("yes", "no"):
        raise ValueError(
            'list the risks whose calls may be approved, e.g. ["read", "create"]'
            " (yes/no is no longer read: a suite says which risks)"
        )
    return _listed(value)


Calls = Annotated[list[Called], BeforeValidator(_listed)]
Texts = Annotated[list[str], BeforeValidator(_listed)]
Risks = Annotated[list[Risk], BeforeValidator(_risks)]


class Expect(BaseModel):
    """What a run of the case must show to pass; every check given must hold."""

    model_config = _STRICT
    stop: Stop = Stop.DONE
    final_contains: Texts = Field(default_factory=list)
    """Texts the final answer must contain (case-insensitive)."""
    final_matches: str | None = None
    """A regular expression the final answer must match somewhere (RE2 syntax: matched
    in time linear in the answer, so no pattern can hang the eval)."""
    called: Calls = Field(default_factory=list)
    not_called: Calls = Field(default_factory=list)
    max_calls: int | None = Field(default=None, ge=0)
    """Tool calls (specialists' included) the run may make at most."""
    max_model_calls: int | None = Field(default=None, ge=0)
    max_tokens: int | None = Field(default=None, ge=0)
    max_cost: float | None = Field(default=None, ge=0)
    """Dollars the run (and its specialists) may cost at most."""
    after: list[After] = Field(default_factory=list)

    @field_validator("final_matches")
    @classmethod
    def _compiles(cls, pattern: str | None) -> str | None:
        if pattern is not None:
            try:
                Pattern(pattern)
            except PatternError as error:
                raise ValueError(str(error)) from None
        return pattern


class RecordedCall(BaseModel):
    """One recorded outcome of a tool (`[[case.recorded]]`)."""

    model_config = _STRICT
    tool: str = Field(min_length=1, max_length=200)
    args: dict[str, Any] | None = None
    """The arguments it answers; none: any arguments not recorded otherwise."""
    output: str = Field(max_length=100_000)
    error: bool = False

    def recorded(self) -> Recorded:
        return Recorded(output=self.output, args=self.args, error=self.error)


class Case(BaseModel):
    """One task, how its run is set up and decided, and what it must show."""

    model_config = _STRICT
    name: str = Field(min_length=1, max_length=80, pattern=r"^[\w .:/-]+$")
    task: str = Field(min_length=1, max_length=100_000)
    context: str = ""
    tools: list[str] | None = None
    """The app's tools the run may use, by name (none given: all of them)."""
    config: dict[str, Any] = Field(default_factory=dict)
    """Config fields that differ from the app's config for this case (its `policy`
    may ask about more risks; a risk the case does not approve is asked about anyway)."""
    budget: Budget | None = None
    min_pass: float = Field(default=1.0, ge=0.0, le=1.0)
    repeat: int | None = Field(default=None, ge=1, le=1_000)
    """Runs of this case per route (none: `relay eval --repeat`, default 1)."""
    memory: bool = False
    """The case's runs keep notes under a name of their own (its `then` runs see them)."""
    then: Texts = Field(default_factory=list)
    """Tasks started one after another once the first run ends, with its memory; the
    checks are of the last run."""
    approve: Risks | None = None
    """The risks whose calls that ask this case approves: some of the suite's `approve`
    (none given: all of the suite's). Any other call that asks is declined."""
    plan: Literal["approve", "decline"] = "approve"
    """How the run's plans are decided (a plan runs nothing itself)."""
    deny: list[str] = Field(default_factory=list)
    """Tools whose calls are denied (the model is told)."""
    edit: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Tools whose calls are approved with these arguments instead of the model's."""
    answers: Texts = Field(default_factory=list)
    """What the person answers to the run's questions, in order (the last repeats)."""
    recorded: list[RecordedCall] = Field(default_factory=list)
    """Recorded outcomes: the calls of these tools never run."""
    expect: Expect = Field(default_factory=Expect)

    @field_validator("config")
    @classmethod
    def _config(cls, fields: dict[str, Any]) -> dict[str, Any]:
        try:
            Config(**fields)  # refused now, not when the case runs
        except DefinitionError as error:
            raise ValueError(str(error).removeprefix("bad Config: ")) from None
        return fields

    def config_over(self, base: Config, unasked: Iterable[Risk]) -> Config:
        """The run's config: `base` (the app's) with the case's fields changed, and a
        policy that asks for every risk not in `unasked` (some of the risks the case
        approves), whatever the case's `policy` says. Such a call then waits for the
        eval, which declines it unless the case approves its risk: a case cannot turn
        the asking off and have a risk its suite does not approve run unasked."""
        config = Config(**{**base.model_dump(), **self.config})
        asked = frozenset(Risk) - frozenset(unasked)
        return config.model_copy(update={"policy": Policy(ask=config.policy.ask | asked)})

    @model_validator(mode="after")
    def _memory_for_then(self) -> Case:
        if self.then and not self.memory:
            raise ValueError("`then` tasks need `memory = true` (they read the first run's notes)")
        return self

    def recorded_tools(self) -> dict[str, list[Recorded]]:
        """The recorded outcomes by tool, for `Relay.start(recorded=...)`."""
        found: dict[str, list[Recorded]] = {}
        for one in self.recorded:
            found.setdefault(one.tool, []).append(one.recorded())
        return found


class Suite(BaseModel):
    """A named list of cases (`[[case]]`), each name used once, and the risks whose
    calls its cases may approve."""

    model_config = _STRICT
    name: str = "suite"
    approve: Risks = Field(default_factory=list)
    """The risks whose calls that ask a person the cases may approve (MONEY needs
    `--allow-money` too); a call of any other risk is declined."""
    case: list[Case] = Field(min_length=1, max_length=MAX_CASES)

    @model_validator(mode="after")
    def _names_once(self) -> Suite:
        seen: set[str] = set()
        for case in self.case:
            if case.name in seen:
                raise ValueError(f"two cases are named {case.name!r}")
            seen.add(case.name)
        return self

    @model_validator(mode="after")
    def _cases_within_the_suite(self) -> Suite:
        for number, case in enumerate(self.case, start=1):
            beyond = [risk.value for risk in case.approve or () if risk not in self.approve]
            if beyond:
                raise ValueError(
                    f"case {number} ({case.name}): approve: {', '.join(beyond)} is not in the"
                    f" suite's approve ({_named(self.approve)}); a case approves some of"
                    " the suite's"
                )
        return self

    def approves(self, case: Case) -> tuple[Risk, ...]:
        """The risks whose calls that ask `case` approves (MONEY still needs the flag)."""
        return tuple(self.approve if case.approve is None else case.approve)


def _named(risks: list[Risk]) -> str:
    return ", ".join(risk.value for risk in risks) or "none"


def builtin_suite_text() -> str:
    """The built-in suite's TOML, as shipped (`workers/evals/builtin.toml`)."""
    return (resources.files("workers.evals") / "builtin.toml").read_text(encoding="utf-8")


def builtin_suite() -> Suite:
    """The built-in suite (`workers/evals/builtin.toml`)."""
    return read_suite(builtin_suite_text().encode(), "the built-in suite", default_name="builtin")


def load_suite(path: str | Path) -> Suite:
    """Read a suite file.

    Raises:
        RelayError: the file cannot be read, is not TOML, or a case is refused (the
            message names the file, the case and the field).
    """
    path = Path(path)
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_SUITE_BYTES + 1)
    except OSError as error:
        raise RelayError(f"{path}: cannot read it: {error.strerror or error}") from None
    if len(raw) > MAX_SUITE_BYTES:
        raise RelayError(f"{path}: a suite is at most {MAX_SUITE_BYTES} bytes")
    return read_suite(raw, str(path), default_name=path.stem)


def read_suite(raw: bytes, where: str, *, default_name: str = "suite") -> Suite:
    """A suite from TOML bytes (`where` names them in errors)."""
    too_deep = f"{where}: tables or arrays nested more than {MAX_DEPTH} deep"
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise RelayError(f"{where}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as error:
        raise RelayError(f"{where}: not TOML: {error}") from None
    except RecursionError:  # (tomllib parses nested values recursively)
        raise RelayError(too_deep) from None
    if _depth(data) > MAX_DEPTH:  # (what tomllib still read would exhaust the checks)
        raise RelayError(too_deep)
    data.setdefault("name", default_name)
    try:
        return Suite.model_validate(data)
    except ValidationError as error:
        raise RelayError(f"{where}: {_first_problem(error, data)}") from None


def _depth(data: object) -> int:
    """How deep tables and arrays nest in `data` (counted without recursing)."""
    deepest, stack = 0, [(data, 0)]
    while stack:
        value, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(value, dict):
            stack += [(inner, depth + 1) for inner in value.values()]
        elif isinstance(value, list):
            stack += [(inner, depth + 1) for inner in value]
    return deepest


def _first_problem(error: ValidationError, data: dict[str, Any]) -> str:
    first = error.errors()[0]
    loc = list(first["loc"])
    said = str(first["msg"]).removeprefix("Value error, ")
    if len(loc) >= 2 and loc[0] == "case" and isinstance(loc[1], int):
        cases = data.get("case")
        named = ""
        if isinstance(cases, list) and loc[1] < len(cases) and isinstance(cases[loc[1]], dict):
            name = cases[loc[1]].get("name")
            named = f" ({name})" if isinstance(name, str) else ""
        field = ".".join(str(part) for part in loc[2:]) or "the case"
        return f"case {loc[1] + 1}{named}: {field}: {said}"
    if not loc:  # (the suite's own checks: their message says where)
        return said
    return f"{'.'.join(str(part) for part in loc)}: {said}"
