"""`python -m bench.slow_model --port P [--seconds 2] [--pieces 60 | --rate 30] [--turns 1]`:
a loopback model server that streams like a hosted model, for thousands of calls at once.

OpenAI-compatible enough for Relay's client and for any HTTP client. A streamed
reply (`"stream": true`) is a role chunk at once, then its text in `--pieces`
content chunks spread evenly over `--seconds` (`--rate R` sets pieces to R a
second instead), then the `finish_reason` chunk, the usage in a last chunk of
its own when the call asks for it (`stream_options.include_usage`, OpenAI's
shape) and `data: [DONE]`. A call that asks for no stream gets the whole
completion after `--seconds`. `GET /stats` says how many calls are in flight
now, the most at once, and how many were answered. It binds 127.0.0.1 only.

Multi-turn runs without tools (`--turns N`): a run's first N-1 replies are
`{"tool": "remember", "args": {"note": "step k ..."}}`, the agent's own
`remember` tool (agent_core: a note the core adds to the run's history at once,
then it asks the model again: a model turn with no tool to run, no Celery tool
step, and no limit but the turn's model calls). The N-th is the final answer.
The turn a request answers is the number of `You noted: ` lines its prompt
shows, so a retried or repeated call gets the same reply. The run must be able
to remember: `Relay.start(task, notes=[])` (notes kept nowhere after the run).

Built to leave the CPU to what it serves: one asyncio `Protocol` a connection
(no stream objects, no task a call), and one timer wheel for every stream (a
tick each `TICK` seconds writes every piece due by then), so a piece costs a
`transport.write` and a list append, not a sleeping coroutine. Each stream keeps
its own phase (pieces are due at its start + k gaps, to a tick), so the pieces
of a thousand streams do not arrive in lockstep. Frames are built once per turn.
Run it in a process of its own, so that its work is counted as no one else's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

__all__ = ["NOTED", "TICK", "main", "reply_text"]

TICK = 0.004
"""Seconds between the wheel's turns: how late a piece may be, at most."""
NOTED = b"You noted: "
"""How the core shows a remembered note in the prompt (agent_core.history)."""
_CREATED = 1_700_000_000
_USAGE = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}


def reply_text(turn: int, turns: int, chars: int) -> str:
    """The reply to a run's `turn` (0-based) of `turns`, padded to about `chars` characters.

    Before the last turn a `remember` call (its note made unique per turn, or the core's
    no-progress check would stop the run), on it the final answer."""
    words = " and more of the same"
    if turn + 1 < turns:
        note = f"step {turn + 1} of {turns}"
        pad = words * (max(0, chars - len(note) - 40) // len(words) + 1)
        return json.dumps(
            {"tool": "remember", "args": {"note": (note + pad)[: max(chars - 40, 8)]}}
        )
    said = f"done after {turns} turns"
    pad = words * (max(0, chars - len(said) - 12) // len(words) + 1)
    return json.dumps({"final": (said + pad)[: max(chars - 12, len(said))]})


def _event(body: dict[str, Any]) -> bytes:
    """One server-sent event as a chunk of a chunked HTTP body."""
    data = b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return _event(
        {
            "id": "chatcmpl-slow",
            "object": "chat.completion.chunk",
            "created": _CREATED,
            "model": "slow",
            "choices": [choice],
        }
    )


def _completion(answer: str) -> bytes:
    message = {"role": "assistant", "content": answer}
    return json.dumps(
        {
            "id": "chatcmpl-slow",
            "object": "chat.completion",
            "created": _CREATED,
            "model": "slow",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": _USAGE,
        }
    ).encode()


@dataclass(frozen=True)
class _Frames:
    """A streamed reply, encoded once: the first event, one per piece, and the tail."""

    head: bytes
    pieces: tuple[bytes, ...]
    tail: bytes
    usage_tail: bytes


def _frames(answer: str, pieces: int) -> _Frames:
    count = min(pieces, len(answer))  # exactly `pieces` parts, unless the text is shorter
    parts = [
        answer[i * len(answer) // count : (i + 1) * len(answer) // count] for i in range(count)
    ]
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    ) + _chunk({"role": "assistant", "content": ""})
    stop = _chunk({}, "stop")
    done = _event_raw(b"data: [DONE]\n\n") + b"0\r\n\r\n"
    usage = _event(
        {"id": "chatcmpl-slow", "object": "chat.completion.chunk", "choices": [], "usage": _USAGE}
    )
    return _Frames(
        head, tuple(_chunk({"content": p}) for p in parts), stop + done, stop + usage + done
    )


def _event_raw(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


@dataclass
class _Stats:
    in_flight: int = 0
    most: int = 0
    answered: int = 0

    def began(self) -> None:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)

    def ended(self) -> None:
        self.in_flight -= 1
        self.answered += 1

    def dropped(self) -> None:
        self.in_flight -= 1

    def as_json(self) -> bytes:
        figures = {"in_flight": self.in_flight, "most": self.most, "answered": self.answered}
        return json.dumps(figures).encode()


@dataclass
class _Stream:
    """One streamed reply on its way: which piece is next, and when it is due."""

    connection: _Connection
    frames: _Frames
    usage: bool
    started: float
    next_piece: int = 0


@dataclass
class _Shape:
    """What every reply looks like: its length in time and pieces, and the run's turns."""

    seconds: float
    pieces: int
    turns: int
    chars: int
    frames: dict[int, _Frames] = field(default_factory=dict)

    def frames_for(self, turn: int) -> _Frames:
        if turn not in self.frames:
            self.frames[turn] = _frames(reply_text(turn, self.turns, self.chars), self.pieces)
        return self.frames[turn]


class _Wheel:
    """Every stream's next piece, by the tick it is due at; one timer turns it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, shape: _Shape, stats: _Stats) -> None:
        self.loop = loop
        self.shape = shape
        self.stats = stats
        self.due: dict[int, list[_Stream]] = defaultdict(list)
        self.turned = math.floor(loop.time() / TICK)
        loop.call_at((self.turned + 1) * TICK, self._turn)

    def add(self, stream: _Stream) -> None:
        self._schedule(stream)

    def _schedule(self, stream: _Stream) -> None:
        gap = self.shape.seconds / len(stream.frames.pieces)
        at = stream.started + (stream.next_piece + 1) * gap
        self.due[max(math.ceil(at / TICK), self.turned + 1)].append(stream)

    def _turn(self) -> None:
        now = math.floor(self.loop.time() / TICK)
        for tick in range(self.turned + 1, now + 1):
            self.turned = tick
            for stream in self.due.pop(tick, ()):
                self._send_piece(stream)
        self.loop.call_at((now + 1) * TICK, self._turn)

    def _send_piece(self, stream: _Stream) -> None:
        frames = stream.frames
        transport = stream.connection.transport
        if transport is None or transport.is_closing():
            self.stats.dropped()  # the client went away: nothing more to send
            return
        piece = frames.pieces[stream.next_piece]
        stream.next_piece += 1
        if stream.next_piece < len(frames.pieces):
            transport.write(piece)
            self._schedule(stream)
            return
        transport.write(piece + (frames.usage_tail if stream.usage else frames.tail))
        self.stats.ended()
        stream.connection.finished()


class _Connection(asyncio.Protocol):
    """One client connection: HTTP/1.1 requests one after another (keep-alive)."""

    def __init__(self, server: _Server) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:  # noqa: ARG002 - asyncio's
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.busy:
            self._next_request()

    def finished(self) -> None:
        """The reply in progress is all sent: read the next request, if one came."""
        self.busy = False
        self._next_request()

    def _next_request(self) -> None:
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0 or self.transport is None:
            return
        head = bytes(self.buffer[:end]).decode("latin-1").split("\r\n")
        length = 0
        for line in head[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        if len(self.buffer) < end + 4 + length:
            return
        body = bytes(self.buffer[end + 4 : end + 4 + length])
        del self.buffer[: end + 4 + length]
        method, path, _ = head[0].split(" ", 2)
        self.busy = True
        self.server.answer(self, method, path, body)

    def send(self, status: int, body: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(
                b"HTTP/1.1 %d OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                % (status, len(body), body)
            )
        self.finished()


class _Server:
    def __init__(self, loop: asyncio.AbstractEventLoop, shape: _Shape) -> None:
        self.loop = loop
        self.shape = shape
        self.stats = _Stats()
        self.wheel = _Wheel(loop, shape, self.stats)

    def answer(self, connection: _Connection, method: str, path: str, body: bytes) -> None:
        if method == "GET" and path.startswith("/stats"):
            connection.send(200, self.stats.as_json())
            return
        if method != "POST" or not path.rstrip("/").endswith("/chat/completions"):
            connection.send(404, b'{"error": {"message": "no such route"}}')
            return
        asked = json.loads(body or b"{}")
        turn = min(body.count(NOTED), self.shape.turns - 1)
        self.stats.began()
        if asked.get("stream") is True:
            usage = bool((asked.get("stream_options") or {}).get("include_usage"))
            assert connection.transport is not None
            frames = self.shape.frames_for(turn)
            connection.transport.write(frames.head)
            self.wheel.add(_Stream(connection, frames, usage, self.loop.time()))
            return
        answer = reply_text(turn, self.shape.turns, self.shape.chars)
        self.loop.call_later(self.shape.seconds, self._whole, connection, answer)

    def _whole(self, connection: _Connection, answer: str) -> None:
        self.stats.ended()
        connection.send(200, _completion(answer))


async def _main(port: int, shape: _Shape) -> None:
    loop = asyncio.get_running_loop()
    server = _Server(loop, shape)
    listening = await loop.create_server(
        lambda: _Connection(server), "127.0.0.1", port, backlog=4096
    )
    print(f"listening on 127.0.0.1:{port}", flush=True)
    async with listening:
        await listening.serve_forever()


def shape_of(
    seconds: float, pieces: int, rate: float | None, turns: int, chars: int | None
) -> _Shape:
    """The replies' shape from the command line: `rate` (pieces a second) wins over `pieces`;
    `chars` defaults to four characters a piece (a token's worth)."""
    count = max(1, round(rate * seconds) if rate else pieces)
    return _Shape(seconds, count, max(1, turns), chars if chars is not None else 4 * count)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.slow_model", description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--seconds", type=float, default=2.0, help="a reply's length in time")
    parser.add_argument("--pieces", type=int, default=60, help="content chunks a reply")
    parser.add_argument("--rate", type=float, help="content chunks a second (sets --pieces)")
    parser.add_argument("--turns", type=int, default=1, help="model turns a run (see above)")
    parser.add_argument("--chars", type=int, help="a reply's length (default: 4 a piece)")
    args = parser.parse_args(argv)
    shape = shape_of(args.seconds, args.pieces, args.rate, args.turns, args.chars)
    asyncio.run(_main(args.port, shape))


if __name__ == "__main__":
    main()
