"""Where a fleet's model calls may go: its routes, in order of preference.

    ModelRoute("primary", url="https://a.example/v1", model="big", key_env="A_KEY",
               rpm=600, tpm=400_000, price=Price(input_per_m=2.0, output_per_m=8.0)),
    ModelRoute("backup", url="http://vllm:8000/v1", model="qwen2.5-7b", rpm=120,
               protocol="json"),

A call tries the routes in order (`workers.model.router`). Each route's `rpm`,
`tpm` and `max_concurrency` are limits the whole fleet shares (in Redis:
`workers.model.limits`). With no routes given, `RELAY_MODEL_URL`, `RELAY_MODEL` and
`RELAY_MODEL_KEY` make the one route `default`; `RELAY_MODELS` may name a JSON
or TOML file of routes (a list of them, or `{"routes": [...]}`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, SecretStr

from workers.engine.budget import Price
from workers.errors import RelayError, SettingsError
from workers.settings import (
    ModelProtocol,
    ModelSettings,
    Settings,
    chat_completions_url,
    load_entries,
)

__all__ = ["ModelRoute", "checked_routes", "load_routes", "routes_from"]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def _route_name(value: str) -> str:
    if not _NAME.fullmatch(value):
        raise ValueError("a route name is 1 to 64 letters, digits, '_', '-' or '.'")
    return value


def _env_name(value: str | None) -> str | None:
    if value is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value):
        raise ValueError("key_env names an environment variable")
    return value


class ModelRoute(BaseModel):
    """One model server and model, with the limits the fleet keeps for it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: Annotated[str, AfterValidator(_route_name)]
    url: Annotated[str, AfterValidator(chat_completions_url)]
    model: str = Field(min_length=1, max_length=200)
    key_env: Annotated[str | None, AfterValidator(_env_name)] = None
    """The environment variable holding its bearer key (read where a worker calls it)."""
    rpm: int | None = Field(default=None, gt=0, le=10**7)
    """Requests per minute, shared by the fleet (calls are spaced evenly)."""
    tpm: int | None = Field(default=None, gt=0, le=10**12)
    """Tokens per minute, shared by the fleet."""
    max_concurrency: int | None = Field(default=None, gt=0, le=10**6)
    """Calls in flight at once, across the fleet."""
    price: Price | None = None
    timeout: float | None = Field(default=None, gt=0, le=3600, allow_inf_nan=False)
    """Seconds without a byte from this server (default RELAY_MODEL_TIMEOUT)."""
    protocol: ModelProtocol = "text"
    """How the agent's reply object is asked for: `text` (the system text alone), `json`
    (also a JSON schema of the replies allowed, for a server that constrains its
    decoding), `tools` (native function calling). A server that refuses `json` or
    `tools` is spoken to in text from then on (`workers.model.protocols`)."""

    def __init__(self, name: str | None = None, /, **fields: Any) -> None:
        # The name may come first, positionally; pydantic's validation passes it by name.
        super().__init__(**fields if name is None else {**fields, "name": name})

    def client_settings(self, settings: Settings) -> ModelSettings:
        """What a client of this route needs (the key read from `key_env` now)."""
        key = os.environ.get(self.key_env, "") if self.key_env else ""
        return ModelSettings(
            url=self.url,
            model=self.model,
            key=SecretStr(key) if key else settings.model_key,
            connect_timeout=settings.model_connect_timeout,
            read_timeout=self.timeout or settings.model_timeout,
            retries=settings.model_retries,
            deadline=settings.model_deadline,
            max_tokens=settings.model_max_tokens,
            protocol=self.protocol,
        )


def routes_from(given: Sequence[ModelRoute] | None, settings: Settings) -> tuple[ModelRoute, ...]:
    """The routes of a Relay: those given, else RELAY_MODELS's file, else the one route
    RELAY_MODEL_URL and RELAY_MODEL make (none without a URL).

    Raises:
        SettingsError: two routes share a name, or RELAY_MODELS cannot be read.
    """
    if given:
        routes = tuple(given)
    elif settings.models:
        routes = load_routes(settings.models)
    elif settings.model_url is not None:
        routes = (ModelRoute("default", url=settings.model_url, model=settings.model),)
    else:
        routes = ()
    names = [r.name for r in routes]
    if len(set(names)) != len(names):
        raise SettingsError(f"model routes share a name: {', '.join(sorted(names))}")
    return routes


def load_routes(path: str | Path) -> tuple[ModelRoute, ...]:
    """Read routes from a JSON or TOML file: a list of routes, or `{"routes": [...]}`.

    Raises:
        SettingsError: the file cannot be read, or a route is not one (one line).
    """
    return load_entries(path, ModelRoute, variable="RELAY_MODELS", what="route")


def checked_routes(
    route: str | Sequence[str] | None, known: Sequence[str]
) -> tuple[str, ...] | None:
    """The model routes a run may take, in order: `route` (one name or several), each one
    of `known`; None: all of them."""
    if route is None:
        return None
    names = (route,) if isinstance(route, str) else tuple(route)
    unknown = [n for n in names if not isinstance(n, str) or n not in known]
    if unknown or not names:
        told = ", ".join(known) or "none (set RELAY_MODELS)"
        raise RelayError(f"no model route {', '.join(map(str, unknown))!s}; routes: {told}")
    return names
