"""The OpenAI-compatible chat completions wire format, with no I/O.

The body a call sends (`chat_body`), the reply it reads back (`parse_reply`, or
`StreamedReply` for a reply streamed as server-sent events), the error a
non-200 answer becomes (`error_for_status`), and the arithmetic of waiting
before a retry (`backoff_seconds`, `parse_retry_after`). The HTTP client that
uses them is `workers.model.transport`.

A streamed reply (`"stream": true`) is a series of `data: {json}` events, each
with a piece of the text in `choices[0].delta.content`, the last with
`finish_reason`, then (asked for with `stream_options.include_usage`) one with
`usage`, then `data: [DONE]`. `StreamedReply` reads it as bytes arrive: lines
are split on bytes and decoded whole, so a chunk cut inside a UTF-8 character
or a JSON escape is read right; comments (`: keep-alive`) and other fields are
skipped. What each stream ends as:

- `[DONE]`: the reply (read to the end of the body, if the server closes it);
- no `[DONE]`, but a `finish_reason` came: the reply (the server said it ended);
- neither: `ModelCallError`, retryable (like a dropped connection);
- a reply that ends inside a JSON object it opened, with no whole object before
  it, and was not stopped at the length limit: `ModelCallError`, retryable (a
  gateway that cut the stream short, whatever `finish_reason` it claims);
- an `error` object in an event: `ModelCallError`, retryable (the request was
  accepted; what fails later is the server's);
- an event that is not JSON, or a `choices` that is not a list: unusable,
  `ModelCallError`, not retryable;
- no `usage`: tokens are estimated (4 bytes a token), so budgets still count it.

Function calls (a route speaking `tools`) come in `message.tool_calls`, or streamed as
`delta.tool_calls` pieces joined by their `index` (`workers.model.protocols.CallPieces`);
a reply of calls alone has no text, and the client writes the object they stand for.

A `Model` is called through `complete`, on the process's event loop (DESIGN §10.1).
An async model (`async def complete`, as `ModelClient`'s) is awaited there and costs
no thread while it waits. A sync model (one a user or a test wrote) runs in a thread
of its own for as long as it runs (`asyncio.to_thread`), so it costs one thread a call
in flight: fine for a few, not for a thousand. Either way its `on_text` is called on
the loop's thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import math
import re
from base64 import b64encode
from collections.abc import Awaitable, Callable, Mapping
from email.utils import parsedate_to_datetime
from http import HTTPStatus
from typing import Any, Protocol, TypeVar

import msgspec
from pydantic import BaseModel, ConfigDict, NonNegativeInt, ValidationError

from agent_core.reply import ends_inside_object
from agent_core.steps import Attachment, ModelRequest
from agent_core.text import cut
from workers.engine.records import Usage
from workers.errors import ModelCallError
from workers.model.protocols import CallPieces, FunctionCall

__all__ = [
    "RESTART",
    "Model",
    "ModelReply",
    "StreamedReply",
    "awaited",
    "backoff_seconds",
    "chat_body",
    "complete",
    "error_for_status",
    "excerpt",
    "one_line",
    "parse_reply",
    "parse_retry_after",
    "streaming",
    "takes_text",
]

T = TypeVar("T")

MESSAGE_CHARS = 500
"""How much of a server's error text an error carries."""
EXCERPT_CHARS = 120
"""How much of an unusable body an error quotes."""


RESTART = ""
"""What a model passes to `on_text` when its reply starts over (a retry after part of
it was streamed): what came before is void. A piece of text is never empty."""


class Model(Protocol):
    """What Relay needs of a model: a reply to a request (`workers.model.transport.ModelClient`
    for an HTTP server; `Relay(model=...)` takes any other).

    `complete` is either `async def` (awaited on the process's event loop) or a plain
    function returning the reply (run in a thread of its own: see the module).
    `on_text`, when given, is called with each piece of the reply's text as it
    arrives, and with `RESTART` when the reply starts over; the pieces of the last
    start, joined, are the reply's text. A model that cannot stream may call it once
    with the whole text, or never. It must not raise. A model written without
    `on_text` still works (`takes_text`).
    """

    def complete(
        self,
        request: ModelRequest,
        *,
        should_stop: Callable[[], bool] | None = None,
        on_text: Callable[[str], None] | None = None,
    ) -> ModelReply | Awaitable[ModelReply]: ...


async def complete(
    model: Model,
    request: ModelRequest,
    *,
    should_stop: Callable[[], bool] | None = None,
    on_text: Callable[[str], None] | None = None,
) -> ModelReply:
    """`model.complete(...)`'s reply, awaited on the running loop, handing `on_text` only
    to a model that takes it. A sync model runs in a thread (`asyncio.to_thread`); the
    pieces it hands over are passed to `on_text` on the loop, all of them before this
    returns, and none once this has returned or been cancelled."""
    given = on_text if on_text is not None and takes_text(model) else None
    if inspect.iscoroutinefunction(model.complete):
        text = {} if given is None else {"on_text": given}
        return await awaited(model.complete(request, should_stop=should_stop, **text))
    if given is None:
        answer = await asyncio.to_thread(model.complete, request, should_stop=should_stop)
        return await awaited(answer)
    loop, live = asyncio.get_running_loop(), [True]

    def on_loop(piece: str) -> None:
        if live[0]:  # a piece the thread wrote after the call ended is void
            given(piece)

    def from_thread(piece: str) -> None:
        loop.call_soon_threadsafe(on_loop, piece)

    try:
        answer = await asyncio.to_thread(
            model.complete, request, should_stop=should_stop, on_text=from_thread
        )
        # The thread's pieces were queued on the loop before its result, so they are in.
        return await awaited(answer)
    finally:
        live[0] = False


async def awaited(answer: T | Awaitable[T]) -> T:
    """`answer` itself, or what it stands for if it is awaitable (a sync model's reply or
    an async one's; a retry check that may read Redis; an async tool's call)."""
    return await answer if inspect.isawaitable(answer) else answer


def takes_text(model: object) -> bool:
    """Whether `model.complete` accepts `on_text` (a Model written before streaming does not)."""
    try:
        parameters = inspect.signature(model.complete).parameters  # type: ignore[attr-defined]
    except (AttributeError, TypeError, ValueError):
        return False
    return "on_text" in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    )


class ModelReply(BaseModel):
    """The model's text, the tokens the call used, the model that answered (as the
    server names it) and why the reply ended (`stop`, `length`, ...), where it says."""

    model_config = ConfigDict(frozen=True)

    text: str
    usage: Usage = Usage()
    model: str | None = None
    finish_reason: str | None = None
    spent_for_s: float | None = None
    """The server said (`x-ratelimit-remaining-*: 0`) that it takes no more calls for this
    long: the route pauses until then, for the whole fleet, without waiting for a 429."""
    tool_calls: tuple[FunctionCall, ...] = ()
    """The functions the server called (a route speaking `tools`); the client makes
    `text` the reply object they stand for (`workers.model.protocols.reply_text`)."""
    protocol_fallback: str | None = None
    """On the reply of the call that found the server refuses its route's protocol: the
    refusal (the client speaks text from then on)."""


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


_DURATION = re.compile(r"(?:([0-9]+(?:\.[0-9]+)?)(ms|h|m|s))", re.IGNORECASE)
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: str | None) -> float | None:
    """Return the seconds of a duration as OpenAI's rate-limit headers write it
    (`"1m30s"`, `"120ms"`, `"6s"`, `"0.5s"`, `"1h2m3.5s"`; a bare number is seconds),
    or None if it is not one."""
    if value is None:
        return None
    text = value.strip().lower()
    if re.fullmatch(r"[0-9]+(\.[0-9]+)?", text):
        return float(text)
    parts = _DURATION.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        return None
    return sum(float(number) * _UNITS[unit] for number, unit in parts)


def _seconds(value: str | None) -> float | None:
    """A plain number of seconds (`"60"`, `"53.21"`), or None."""
    if value is None or not re.fullmatch(r"[0-9]+(\.[0-9]+)?", value.strip()):
        return None
    seconds = float(value)
    return seconds if math.isfinite(seconds) else None


def rate_limit_wait(headers: Mapping[str, str], now: float) -> float | None:
    """Return how long a 429 (or a 503) asks to wait, read from every header providers
    and gateways use, or None if none says: `retry-after` (seconds or an HTTP date),
    `retry-after-ms`, LiteLLM's `llm_provider-retry-after` (the provider's own, which
    the gateway does not put in `retry-after`), and OpenAI's `x-ratelimit-reset-requests`
    and `-tokens` (the one whose `x-ratelimit-remaining-*` is 0, else the later). When
    several say, the longest wait is taken: coming back early only earns another 429."""
    said: list[float] = []
    for found in (
        parse_retry_after(headers.get("retry-after"), now),
        _seconds(headers.get("llm_provider-retry-after")),
        None if (ms := _seconds(headers.get("retry-after-ms"))) is None else ms / 1000,
    ):
        if found is not None:
            said.append(found)
    if said:
        return max(said)
    return _reset_wait(headers, exhausted_only=False)


def exhausted_wait(headers: Mapping[str, str]) -> float | None:
    """Return how long a route has nothing left, from a successful answer's headers:
    the reset of the requests or tokens whose `x-ratelimit-remaining-*` is 0 (so the
    fleet pauses the route until then, without waiting for a 429); None otherwise."""
    return _reset_wait(headers, exhausted_only=True)


def _reset_wait(headers: Mapping[str, str], *, exhausted_only: bool) -> float | None:
    """The reset of what `x-ratelimit-remaining-*` says is spent (the later, if both are);
    without one spent, the later reset (or None with `exhausted_only`)."""
    spent: list[float] = []
    others: list[float] = []
    for kind in ("requests", "tokens"):
        reset = parse_duration(headers.get(f"x-ratelimit-reset-{kind}"))
        if reset is None:
            continue
        remaining = (headers.get(f"x-ratelimit-remaining-{kind}") or "").strip()
        (spent if remaining == "0" else others).append(reset)
    if spent:
        return max(spent)
    return None if exhausted_only or not others else max(others)


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


def streaming(body: dict[str, Any]) -> dict[str, Any]:
    """Return `body` asking for a streamed reply, with its usage at the end."""
    return body | {"stream": True, "stream_options": {"include_usage": True}}


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


def _event_json(data: bytes) -> Any:
    """A streamed event's JSON: decoded by msgspec (a fifth of the stdlib's time, and an
    event comes for every piece of every reply a process streams), or, where msgspec
    refuses text the stdlib takes (bytes that are not UTF-8, a lone surrogate), as the
    stdlib reads it, bad bytes replaced."""
    try:
        return msgspec.json.decode(data)
    except msgspec.DecodeError:
        return json.loads(data.decode("utf-8", "replace"))


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
    calls = CallPieces()
    if isinstance(message, dict) and message.get("tool_calls") is not None:
        calls.add(message["tool_calls"], whole=True)
    if content is None and calls.calls():
        content = ""  # a reply of function calls alone
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
        tool_calls=calls.calls(),
    )


class StreamedReply:
    """A chat completion streamed as server-sent events, read as its bytes arrive.

    `feed(data)` takes the next bytes of the body and returns the pieces of text
    they completed; `done` says `[DONE]` came; once the body ended, `end()` returns
    the pieces of a last event with no blank line after it, and `reply(prompt_bytes)`
    is the whole reply (raising ModelCallError if it is not complete). See the
    module's docstring for what each kind of stream ends as. Each byte is looked
    at once, however the body is cut.
    """

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._scanned = 0  # bytes of the buffer known to hold no line end
        self._data: list[bytes] = []
        self._text: list[str] = []
        self._usage: Usage | None = None
        self._model: str | None = None
        self._finish: str | None = None
        self._calls = CallPieces()
        self.done = False
        """`data: [DONE]` came: the reply is whole."""

    def feed(self, data: bytes, pieces: list[str] | None = None) -> list[str]:
        """Read the next bytes of the body; return the pieces of text they completed,
        appended to `pieces` if given (as each event completes: those before an event
        that raises are there when it does)."""
        pieces = [] if pieces is None else pieces
        buffer = self._buffer
        buffer += data
        end = -1 if self.done else buffer.rfind(b"\n", self._scanned)
        if end >= 0:  # every whole line at once (a read may bring many events)
            lines = bytes(buffer[:end]).split(b"\n")
            del buffer[: end + 1]
            self._lines(lines, pieces)
        self._scanned = len(buffer)
        return pieces

    def _lines(self, lines: list[bytes], pieces: list[str]) -> None:
        """Whole lines of the body, as bytes: only an event's JSON is decoded, once, whole."""
        values = self._data
        for read in lines:
            line = read.rstrip(b"\r")
            if not line:  # a blank line ends an event
                self._dispatch(pieces)
                if self.done:
                    return
            elif line.startswith(b"data:"):
                value = line[5:]
                values.append(value[1:] if value.startswith(b" ") else value)
            # Comments (": keep-alive") and the other fields (event, id, retry) say nothing.

    def end(self) -> list[str]:
        """The body ended: return the pieces of text of a last event left without a blank
        line after it (one cut short is dropped)."""
        pieces: list[str] = []
        if not self.done:
            if self._buffer:
                self._lines([bytes(self._buffer)], pieces)
                self._buffer.clear()
            with contextlib.suppress(ModelCallError):  # one cut off by the body's end is none
                self._dispatch(pieces)
        return pieces

    def _dispatch(self, pieces: list[str]) -> None:
        values = self._data
        if not values:
            return
        data = b"\n".join(values)  # (one line: joined, it is that line itself, not a copy)
        values.clear()
        if not data:
            return
        if data.strip() == b"[DONE]":
            self.done = True
            return
        try:
            event = _event_json(data)
        except (ValueError, RecursionError):
            raise _unusable(f"a streamed event is not JSON: {excerpt(data)}") from None
        if not isinstance(event, dict):
            raise _unusable(f"a streamed event is not an object: {excerpt(data)}")
        if "error" in event:
            said = _server_message(data)
            raise ModelCallError(f"the model server failed mid-stream: {said}", retryable=True)
        piece = self._read(event)
        if piece:
            self._text.append(piece)
            pieces.append(piece)

    def _read(self, event: dict[str, Any]) -> str:
        """Take the event's model, usage and finish reason; return its piece of text."""
        model = event.get("model")
        if isinstance(model, str) and model:
            self._model = model[:200]
        if event.get("usage") is not None:
            self._usage = _parse_usage(event["usage"])
        choices = event.get("choices")
        if choices is None:
            return ""
        if not isinstance(choices, list):
            raise _unusable("a streamed event's choices is not a list")
        first = choices[0] if choices and isinstance(choices[0], dict) else {}
        finish = first.get("finish_reason")
        if isinstance(finish, str) and finish:
            self._finish = finish[:40]
        delta = first.get("delta")
        if isinstance(delta, dict) and delta.get("tool_calls") is not None:
            self._calls.add(delta["tool_calls"], whole=False)
        content = delta.get("content") if isinstance(delta, dict) else None
        return content if isinstance(content, str) else ""

    def reply(self, prompt_bytes: int) -> ModelReply:
        """Return the whole reply once the body ended; raise ModelCallError (retryable) if
        it ended before the reply did. A stream without usage is counted at 4 bytes a token
        (`prompt_bytes`: the size of the request)."""
        if not self.done and self._finish is None:
            raise ModelCallError(
                "the model server's stream ended before the reply was complete (no [DONE])",
                retryable=True,
                status=200,
            )
        text, calls = "".join(self._text), self._calls.calls()
        if self._finish != "length" and not calls and ends_inside_object(text):
            said = f"finish_reason {self._finish!r}" if self._finish else "[DONE]"
            raise ModelCallError(
                f"the model server's stream ended inside a JSON object ({len(text)} characters,"
                f" then {said}): taken as a dropped stream",
                retryable=True,
                status=200,
            )
        usage = self._usage
        if usage is None:
            written = len(text.encode()) + self._calls.size()
            prompt, completion = -(-prompt_bytes // 4), -(-written // 4)
            usage = Usage(
                prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion
            )
        return ModelReply(
            text=text, usage=usage, model=self._model, finish_reason=self._finish, tool_calls=calls
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
    retry_after = rate_limit_wait(headers, now) if retryable else None
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
