"""Specialists: helpers with a subset of the tools that the model may delegate to."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict

from agent_core.errors import DefinitionError
from agent_core.text import clean
from agent_core.tools import check_name

__all__ = ["Specialist"]


class Specialist(BaseModel):
    """`Specialist(name, description).tools([...]).instructions(text)`.

    The parent's model sees the name and description; the instructions go
    only to the child, which has only the listed tools.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    description: str
    tool_names: tuple[str, ...] = ()
    guidance: str = ""

    def __init__(self, name: str, description: str, **fields: Any) -> None:
        check_name(name, "specialist")
        if not isinstance(description, str):
            raise DefinitionError(f"specialist {name!r} needs a text description")
        super().__init__(name=name, description=clean(description), **fields)

    def tools(self, names: Iterable[str]) -> Specialist:
        """Return this specialist with the names of the tools it may use."""
        listed = tuple(check_name(n, "tool") for n in names)
        if len(set(listed)) != len(listed):
            raise DefinitionError(f"specialist {self.name!r} lists a tool twice")
        return self.model_copy(update={"tool_names": listed})

    def instructions(self, text: str) -> Specialist:
        """Return this specialist with instructions that only its child agent sees."""
        return self.model_copy(update={"guidance": clean(text)})
