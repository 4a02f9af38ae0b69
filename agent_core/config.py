"""The agent's limits and policy."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agent_core.errors import DefinitionError
from agent_core.tools import Policy

__all__ = ["Config"]


class Config(BaseModel):
    """Limits and policy for one agent. Every field has a sensible default."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_calls: int = Field(default=12, ge=1, le=10_000)
    """Tool calls (including delegations) a run may make; one more ends it with CALL_LIMIT."""
    max_batch: int = Field(default=1, ge=1, le=64)
    """Calls the model may ask for in one reply; above 1 the batch form is offered."""
    require_plan: bool = True
    """Ask for a plan first, to be approved before any call runs."""
    max_plan_steps: int = Field(default=8, ge=1, le=100)
    """A longer plan is sent back to be shortened."""
    max_retries: int = Field(default=3, ge=0, le=100)
    """Unusable replies (or failed model calls) in a row that are retried before the run stops."""
    history_chars: int = Field(default=24_000, ge=1_000, le=10_000_000)
    """The history shown to the model stays within this many characters."""
    summarize: bool = False
    """Fold old history into a summary the model writes, instead of dropping it."""
    policy: Policy = Policy.CAUTIOUS
    """Which risks ask a person before a call runs."""
    max_repeats: int = Field(default=3, ge=2, le=1_000)
    """No-progress detection, per turn: at this many identical calls (same tool, same
    arguments, same result; remembered notes and answered questions too) or failed
    calls in a row, the model is told once; at twice as many the turn stops with
    NO_PROGRESS."""
    max_model_calls: int | None = Field(default=None, ge=1, le=1_000_000)
    """Model calls one turn may use: every reply or failure counts, summaries, questions,
    notes, skill loads and continuations of cut replies included. The last one is asked
    for the final answer; a turn that would need another ends with MODEL_CALL_LIMIT.
    None: `2 * max_calls + 20` (see `allowed_model_calls`)."""

    def __init__(self, **fields: Any) -> None:
        try:
            super().__init__(**fields)
        except ValidationError as error:
            raise DefinitionError(f"bad Config: {error}") from None

    @property
    def allowed_model_calls(self) -> int:
        """Return the model calls one turn may use: `max_model_calls`, or its default.

        The default leaves room for a call per tool call, a plan, retries,
        summaries, notes, skills and questions, yet bounds a model that never
        stops taking turns that do not count against `max_calls`.
        """
        if self.max_model_calls is not None:
            return self.max_model_calls
        return 2 * self.max_calls + 20
