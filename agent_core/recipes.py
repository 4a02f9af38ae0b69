"""Recipes: a task with blanks, filled with values and fired on a trigger.

    recipe = (
        Recipe("monthly-spend", "Total the spend for {month}; flag items over {limit}.")
        .param("month", "which month, in words")
        .param("limit", "the amount that needs a flag")
        .only_tools(["read_ledger"])
    )
    recipe.fill({"month": "last month", "limit": "50,000"})

A template's blanks are `{name}`; `{{` and `}}` are literal braces; any other
brace is refused when the recipe is built (`DefinitionError`). Filling is one
pass over the template: a value is inserted as it is, never read for blanks, so
a value may hold any text at all. A recipe is plain data: it survives
`model_dump_json` / `model_validate_json` unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from agent_core.errors import DefinitionError, RecipeError
from agent_core.text import clean, cut
from agent_core.tools import Tool, check_name

__all__ = ["Recipe", "RecipeParam"]

_BRACE = re.compile(r"[{}]")
# Tells "not given" from any value: pydantic calls __init__ with keywords when
# it reads JSON, and a missing field must become its error, not a TypeError.
_UNSET: Any = object()
_SHOWN_NAMES = 5


class RecipeParam(BaseModel):
    """One declared blank of a recipe, with help for whoever fills it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    help: str = ""


class Recipe(BaseModel):
    """`Recipe(name, template).param(name, help).only_tools([...])`.

    `tool_names` is None until `only_tools` is called, meaning every tool.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    template: str
    params: tuple[RecipeParam, ...] = ()
    tool_names: tuple[str, ...] | None = None

    def __init__(self, name: str = _UNSET, template: str = _UNSET, **fields: Any) -> None:
        """Build a recipe; raises `DefinitionError` for a bad name or template.

        Raises:
            DefinitionError: the name is not a usable identifier, the template is
                not text or has a brace that is neither doubled nor a `{name}`.
        """
        if name is _UNSET or template is _UNSET:
            raise DefinitionError("a recipe needs a name and a template")
        check_name(name, "recipe")
        if not isinstance(template, str):
            raise DefinitionError(f"recipe {name!r} needs a text template")
        _split_template(template)
        super().__init__(name=name, template=template, **fields)

    def param(self, name: str, help: str = "") -> Recipe:  # noqa: A002 - public name
        """Return this recipe with a blank declared.

        Raises:
            DefinitionError: the name is not a usable identifier, is already
                declared, or `help` is not text.
        """
        check_name(name, "recipe param")
        if any(p.name == name for p in self.params):
            raise DefinitionError(f"recipe {self.name!r} already has a param {name!r}")
        if not isinstance(help, str):
            raise DefinitionError(f"recipe param {name!r} needs text help")
        added = RecipeParam(name=name, help=clean(help))
        return self.model_copy(update={"params": (*self.params, added)})

    def only_tools(self, names: Iterable[str]) -> Recipe:
        """Return this recipe limited to the named tools (replacing any earlier list).

        Raises:
            DefinitionError: `names` is a single string, or holds a name that is
                not a usable identifier, or the same name twice.
        """
        if isinstance(names, str):
            raise DefinitionError(f"recipe {self.name!r} needs a list of tool names, not one text")
        listed = tuple(check_name(n, "tool") for n in names)
        if len(set(listed)) != len(listed):
            raise DefinitionError(f"recipe {self.name!r} lists a tool twice: {listed}")
        return self.model_copy(update={"tool_names": listed})

    def blanks(self) -> list[str]:
        """Return the blanks the template uses, in order of first use."""
        _, names = self._parts()
        return list(dict.fromkeys(names))

    def fill(self, values: Mapping[str, str]) -> str:
        """Return the template with every blank replaced by its value, as given.

        Raises:
            RecipeError: the template uses a blank that is not a declared param;
                a value is given for a name that is not a declared param; a
                declared param has no value; a value is not text; or the
                template itself is unusable (possible only for a recipe read
                from outside).
        """
        if not isinstance(values, Mapping):
            raise RecipeError(f"recipe {self.name!r} is filled from a mapping of blank to value")
        literals, names = self._parts()
        declared = {p.name for p in self.params}
        self._check_values(values, declared, names)
        pieces = [literals[0]]
        for name, literal in zip(names, literals[1:], strict=True):
            pieces.append(values[name])
            pieces.append(literal)
        return clean("".join(pieces))

    def tools_for(self, all_tools: Sequence[Tool]) -> list[Tool]:
        """Return the tools this recipe may use, in the order of `all_tools`.

        Raises:
            DefinitionError: `only_tools` named a tool that `all_tools` lacks.
        """
        if self.tool_names is None:
            return list(all_tools)
        known = {t.name for t in all_tools}
        absent = [n for n in self.tool_names if n not in known]
        if absent:
            raise DefinitionError(
                f"recipe {self.name!r} uses tools that do not exist: {_listed(absent)}"
            )
        wanted = set(self.tool_names)
        return [t for t in all_tools if t.name in wanted]

    def _parts(self) -> tuple[list[str], list[str]]:
        try:
            return _split_template(self.template)
        except DefinitionError as error:
            raise RecipeError(f"recipe {self.name!r}: {error}") from None

    def _check_values(self, values: Mapping[Any, Any], declared: set[str], used: list[str]) -> None:
        """Raise `RecipeError` naming whatever keeps `values` from filling the template."""
        undeclared = [n for n in dict.fromkeys(used) if n not in declared]
        if undeclared:
            raise RecipeError(
                f"recipe {self.name!r} uses blanks never declared with .param():"
                f" {_listed(undeclared)}"
            )
        unknown = [k for k in values if k not in declared]
        if unknown:
            raise RecipeError(
                f"recipe {self.name!r} has no blank named {_listed(unknown)};"
                f" its blanks are {_listed(p.name for p in self.params) or 'none'}"
            )
        missing = [p.name for p in self.params if p.name not in values]
        if missing:
            raise RecipeError(f"recipe {self.name!r} needs a value for {_listed(missing)}")
        not_text = [k for k, v in values.items() if not isinstance(v, str)]
        if not_text:
            raise RecipeError(f"recipe {self.name!r} needs text for {_listed(not_text)}")


def _split_template(template: str) -> tuple[list[str], list[str]]:
    """Return (literal texts, blank names); the literals are one more than the names.

    One scan from left to right, each character looked at a bounded number of
    times, so the time is linear in the template's length.

    Raises:
        DefinitionError: a brace is neither doubled nor part of a `{name}`.
    """
    literals: list[str] = []
    names: list[str] = []
    pieces: list[str] = []  # the literal text since the last blank
    at = 0
    while (found := _BRACE.search(template, at)) is not None:
        brace = found.start()
        pieces.append(template[at:brace])
        char = template[brace]
        if template.startswith(char, brace + 1):  # `{{` or `}}`
            pieces.append(char)
            at = brace + 2
            continue
        if char == "}":
            raise DefinitionError(_lone_brace(template, brace))
        close = template.find("}", brace + 1)
        name = template[brace + 1 : close]
        if close == -1 or not _is_name(name):
            raise DefinitionError(_lone_brace(template, brace))
        literals.append("".join(pieces))
        names.append(name)
        pieces = []
        at = close + 1
    pieces.append(template[at:])
    literals.append("".join(pieces))
    return literals, names


def _is_name(text: str) -> bool:
    try:
        check_name(text, "blank")
    except DefinitionError:
        return False
    return True


def _lone_brace(template: str, index: int) -> str:
    near = template[max(0, index - 20) : index + 20]
    return (
        f"the template has a {template[index]!r} at character {index} (near {near!r})"
        " that is not part of a {name} blank; write {{ or }} for a literal brace"
    )


def _listed(names: Iterable[object]) -> str:
    """Return names for a message: the first few, each shown short."""
    listed = list(names)
    text = ", ".join(cut(repr(n), 80) for n in listed[:_SHOWN_NAMES])
    more = len(listed) - _SHOWN_NAMES
    return f"{text} and {more} more" if more > 0 else text
