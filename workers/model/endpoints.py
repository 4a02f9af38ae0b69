"""What a model endpoint is: its URL, model name, key, timeouts and limits.

Plain data with its checks, shared by the settings (read from RELAY_MODEL_*)
and the HTTP client (`workers.model.transport`); nothing here talks to a server.
"""

from __future__ import annotations

import re
from typing import Annotated
from urllib.parse import urlsplit, urlunsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, SecretStr

__all__ = ["ModelSettings", "chat_completions_url", "check_api_key"]

_CHAT_PATH = "/chat/completions"
_API_KEY = re.compile(r"[\x21-\x7e]+")  # what an HTTP header value can carry as is


def chat_completions_url(url: str) -> str:
    """Return the chat completions endpoint for an OpenAI-compatible `url`.

    A base URL (`http://localhost:11434/v1`) gets `/chat/completions` added; a
    URL that already ends with it is kept. The result is the same if applied twice.
    Raises ValueError (without echoing the URL) for anything but an http(s) URL
    with a host, and for a URL that carries credentials: the key goes in its own
    setting, so it can be kept out of logs.
    """
    expected = "expected an http:// or https:// URL such as http://localhost:11434/v1"
    if not url or any(char.isspace() for char in url):
        raise ValueError(expected)
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError for a port that is not a number
    except ValueError:
        raise ValueError(expected) from None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname or parts.fragment:
        raise ValueError(expected)
    if "@" in parts.netloc:
        raise ValueError("expected no credentials in the URL (set the key on its own)")
    path = parts.path.rstrip("/")
    if not path.endswith(_CHAT_PATH):
        path += _CHAT_PATH
    return urlunsplit((parts.scheme.lower(), parts.netloc, path, parts.query, ""))


def check_api_key(key: str) -> str:
    """Return `key` if it can be sent as a bearer token; raise ValueError (not naming it)."""
    if not _API_KEY.fullmatch(key):
        raise ValueError("expected printable ASCII without spaces")
    return key


def _check_secret_key(key: SecretStr | None) -> SecretStr | None:
    if key is not None:
        check_api_key(key.get_secret_value())
    return key


class ModelSettings(BaseModel):
    """What one model client needs: where, which model, the key, timeouts and limits."""

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    url: Annotated[str, AfterValidator(chat_completions_url)]
    """The chat completions endpoint; a base URL is completed on validation."""
    model: str = Field(default="default", min_length=1)
    key: Annotated[SecretStr | None, AfterValidator(_check_secret_key)] = None
    connect_timeout: float = Field(default=5.0, gt=0, allow_inf_nan=False)
    read_timeout: float = Field(default=120.0, gt=0, allow_inf_nan=False)
    """Seconds without a byte from the server before the attempt is given up."""
    retries: int = Field(default=4, ge=0, le=100)
    """Attempts after the first one, for transient failures only."""
    deadline: float = Field(default=600.0, gt=0, allow_inf_nan=False)
    """Seconds the whole call may take: every attempt, its reads, the waits between them."""
    backoff_base: float = Field(default=0.5, gt=0, allow_inf_nan=False)
    backoff_cap: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    """No wait between attempts is longer, whatever a server's Retry-After says."""
    max_tokens: int = Field(default=4096, ge=0, le=10**7)
    """The reply's cap in tokens, sent as `max_tokens` (0: not sent): it bounds what a
    call can cost, so budgets hold exactly."""
    max_body_bytes: int = Field(default=8 * 1024 * 1024, gt=0)
    attachment_chars: int = Field(default=20_000, gt=0)
    """A text attachment is cut to this many characters."""
