"""The OpenAI-compatible chat completions wire format, with no I/O.

The body a call sends (`chat_body`), the reply it reads back (`parse_reply`),
the error a non-200 answer becomes (`error_for_status`), and the arithmetic of
waiting before a retry (`backoff_seconds`, `parse_retry_after`). The HTTP
client that uses them is `workers.model_client`.
"""

from __future__ import annotations

import json
import math
import re
from base64 import b64encode
from collections.abc import Callable, Mapping
from email.utils import parsedate_to_datetime
from http import HTTPStatus
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, NonNegativeInt, ValidationError

from agent_core.steps import Attachment, ModelRequest
from agent_core.text import cut
from workers.errors import ModelCallError
from workers.records import Usage

__all__ = [
    "Model",
    "ModelReply",
    "backoff_seconds",
    "chat_body",
    "error_for_status",
    "excerpt",
    "one_line",
    "parse_reply",
    "parse_retry_after",
]

MESSAGE_CHARS = 500
"""How much of a server's error text an error carries."""
EXCERPT_CHARS = 120
"""How much of an unusable body an error quotes."""


class Model(Protocol):
    """What Relay needs of a model: a reply to a request (`workers.model_client.ModelClient`
    for an HTTP server; `Relay(model=...)` takes any other)."""

    def complete(
        self, request: ModelRequest, *, should_stop: Callable[[], bool] | None = None
    ) -> ModelReply: ...


class ModelReply(BaseModel):
    """The model's text, the tokens the call used, the model that answered (as the
    server names it) and why the reply ended (`stop`, `length`, ...), where it says."""

    model_config = ConfigDict(frozen=True)

    text: str
    usage: Usage = Usage()
    model: str | None = None
    finish_reason: str | None = None


def backoff_seconds(
    attempt: int, retry_after: float | None, base: float, cap: float, rand: float
) -> float:
    """Return how long to wait before retry number `attempt` (0 for the first retry).

    Full jitter: `rand` (in [0, 1)) picks a point in [0, min(cap, base * 2**attempt)],
    so clients that failed together do not come back together. A server's
    `retry_after` is a floor on that. The result is never more than `cap`.
    """
    ceiling = min(cap, base * 2.0 ** min(max(attempt, 0), 64))
    delay = ceiling * min(max(rand, 0.0), 1.0)
    if retry_after is not None:
        delay = max(delay, retry_after)
    return max(0.0, min(cap, delay))


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Return the seconds a `Retry-After` header asks for, or None if it says nothing usable.

    The header is either seconds or an HTTP date; `now` (Unix seconds) turns a
    date into a wait. A date in the past means no wait.
    """
    if value is None:
        return None
    text = value.strip()
    if re.fullmatch(r"[0-9]+(\.[0-9]+)?", text):
        seconds = float(text)
        return seconds if math.isfinite(seconds) else None
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT; a naive one came without a zone
        return None
    return max(0.0, when.timestamp() - now)


def chat_body(
    model: str, request: ModelRequest, *, attachment_chars: int, max_tokens: int = 0
) -> dict[str, Any]:
    """Return the JSON body of a chat completions call for `request` (with `max_tokens`,
    the reply's cap in tokens, unless it is 0)."""
    content: str | list[dict[str, Any]] = request.prompt
    if request.attachments:
        content = [{"type": "text", "text": request.prompt}]
        content += [_attachment_part(item, attachment_chars) for item in request.attachments]
    body: dict[str, Any] = {
        "model": model,
        "messages": [
            {"role": "system", "content": request.system},
            {"role": "user", "content": content},
        ],
    }
    if max_tokens > 0:
        body["max_tokens"] = max_tokens
    return body


def _attachment_part(attachment: Attachment, limit: int) -> dict[str, Any]:
    if attachment.mime.lower().startswith("image/"):
        data = b64encode(attachment.data).decode("ascii")
        url = f"data:{attachment.mime};base64,{data}"
        return {"type": "image_url", "image_url": {"url": url}}
    heading = f"Attached file {attachment.name} ({attachment.mime}"
    try:
        text = attachment.data.decode("utf-8")
    except UnicodeDecodeError:
        size = len(attachment.data)
        return {"type": "text", "text": f"{heading}, {size} bytes): binary, not shown."}
    return {"type": "text", "text": f"{heading}):\n{cut(text, limit)}"}


def parse_reply(data: bytes) -> ModelReply:
    """Return the reply in a 200 body; raise ModelCallError (not retryable) if unusable.

    An unusable body is not retried here: it is the model's (or its server's)
    answer, and the agent's own retry budget decides whether to ask again.
    """
    try:
        payload = json.loads(data)
    except (ValueError, RecursionError):  # ValueError includes UnicodeDecodeError
        raise _unusable(f"the body is not JSON: {excerpt(data)}") from None
    choices = payload.get("choices") if isinstance(payload, dict) else None
    if not isinstance(choices, list) or not choices:
        raise _unusable(f"the reply has no choices: {excerpt(data)}")
    message = choices[0].get("message") if isinstance(choices[0], dict) else None
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, str):
        kind = type(content).__name__ if content is not None else "missing"
        raise _unusable(f"the reply's choices[0].message.content is not text ({kind})")
    model = payload.get("model")
    finish = choices[0].get("finish_reason")
    return ModelReply(
        text=content,
        usage=_parse_usage(payload.get("usage")),
        model=model[:200] if isinstance(model, str) and model else None,
        finish_reason=finish[:40] if isinstance(finish, str) else None,
    )


class _PromptDetails(BaseModel):
    """OpenAI's breakdown of the prompt tokens (other keys are ignored)."""

    cached_tokens: NonNegativeInt | None = None


class _ServerUsage(BaseModel):
    """The usage object as servers send it: fields may be missing or null."""

    model_config = ConfigDict(strict=True)

    prompt_tokens: NonNegativeInt | None = None
    completion_tokens: NonNegativeInt | None = None
    total_tokens: NonNegativeInt | None = None
    prompt_tokens_details: _PromptDetails | None = None


def _parse_usage(value: object) -> Usage:
    if value is None:
        return Usage()
    try:
        given = _ServerUsage.model_validate(value)
    except ValidationError:
        raise _unusable(f"the reply's usage is not whole numbers >= 0: {value!r:.200}") from None
    prompt = given.prompt_tokens or 0
    completion = given.completion_tokens or 0
    total = prompt + completion if given.total_tokens is None else given.total_tokens
    details = given.prompt_tokens_details
    cached = min(prompt, (details.cached_tokens or 0) if details is not None else 0)
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=total,
        cached_prompt_tokens=cached,
        model_calls=1,
    )


def _unusable(message: str) -> ModelCallError:
    return ModelCallError(
        f"unusable reply from the model server: {message}", retryable=False, status=200
    )


def error_for_status(
    status: int, headers: Mapping[str, str], data: bytes, now: float
) -> ModelCallError:
    """Return the error for a non-200 answer: retryable for 408, 429 and 5xx."""
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "unknown status"
    said = _server_message(data)
    message = f"model server answered {status} {phrase}" + (
        f": {said}" if said and said != phrase else ""
    )
    retryable = status in (408, 429) or status >= 500
    retry_after = parse_retry_after(headers.get("retry-after"), now) if retryable else None
    return ModelCallError(message, retryable=retryable, status=status, retry_after=retry_after)


def _server_message(data: bytes) -> str:
    """Return the server's own words: `error.message` if the body has it, else the body."""
    text = data.decode("utf-8", "replace")
    try:
        payload = json.loads(text)
    except (ValueError, RecursionError):
        payload = None
    if isinstance(payload, dict):
        error = payload.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            text = error["message"]
        elif isinstance(error, str):
            text = error
    return one_line(text, MESSAGE_CHARS)


def one_line(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def excerpt(data: bytes) -> str:
    return repr(one_line(data.decode("utf-8", "replace"), EXCERPT_CHARS)) if data else "empty"
