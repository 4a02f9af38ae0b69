"""Skills: instruction packs in the open Agent Skills `SKILL.md` format."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["Skill"]


class Skill(BaseModel):
    """A skill: the model sees `name` and `description`; `body` loads on `use_skill`."""

    model_config = ConfigDict(frozen=True)

    name: str
    description: str
    body: str
