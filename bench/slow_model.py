"""`python -m bench.slow_model --port P [--seconds 2] [--pieces 10] [--chars 0]`: a
loopback model server on asyncio that takes its time, for thousands of calls at once.

OpenAI-compatible enough for Relay's client: every chat completion answers
`{"final": "done"}` (with `--chars N`, a final answer N characters long, so that a
hundred pieces are token-sized), streamed as `--pieces` events spread over `--seconds` (or sent
whole after them when the call asks for no stream), with the usage when the call
asks for it. `GET /stats` says how many calls are in flight now, the most at once,
and how many were answered. It binds 127.0.0.1 only, and runs in a process of its
own so that its work is not counted as the bench's or a worker's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

__all__ = ["main"]

ANSWER = json.dumps({"final": "done"})


def answer_of(chars: int) -> str:
    """The reply's text: `{"final": "done"}`, or a final answer of `chars` characters."""
    return json.dumps({"final": ("done " * chars)[:chars]}) if chars > 0 else ANSWER


class _Stats:
    def __init__(self) -> None:
        self.in_flight = 0
        self.most = 0
        self.answered = 0

    def as_json(self) -> bytes:
        return json.dumps(
            {"in_flight": self.in_flight, "most": self.most, "answered": self.answered}
        ).encode()


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {
        "id": "chatcmpl-slow",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": "slow",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _usage_chunk() -> bytes:
    usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    body = {"id": "chatcmpl-slow", "object": "chat.completion.chunk", "choices": [], "usage": usage}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _completion(answer: str) -> bytes:
    return json.dumps(
        {
            "id": "chatcmpl-slow",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": "slow",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": answer},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        }
    ).encode()


class _Server:
    def __init__(self, seconds: float, pieces: int, answer: str) -> None:
        self.seconds = seconds
        self.answer = answer
        self.pieces = max(1, pieces)
        self.stats = _Stats()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await self._one(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; False once the connection is done."""
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        fields = (line.partition(":") for line in lines[1:])
        headers = {name.strip().lower(): value.strip() for name, _, value in fields}
        length = int(headers.get("content-length") or 0)
        raw = await reader.readexactly(length) if length else b""
        if method == "GET" and path.startswith("/stats"):
            await self._send(writer, 200, self.stats.as_json())
            return True
        if method != "POST" or not path.rstrip("/").endswith("/chat/completions"):
            await self._send(writer, 404, b'{"error": {"message": "no such route"}}')
            return True
        body = json.loads(raw or b"{}")
        self.stats.in_flight += 1
        self.stats.most = max(self.stats.most, self.stats.in_flight)
        try:
            if body.get("stream") is True:
                usage = bool((body.get("stream_options") or {}).get("include_usage"))
                await self._stream(writer, usage)
            else:
                await asyncio.sleep(self.seconds)
                await self._send(writer, 200, _completion(self.answer))
        finally:
            self.stats.in_flight -= 1
        self.stats.answered += 1
        return True

    async def _send(self, writer: asyncio.StreamWriter, status: int, body: bytes) -> None:
        writer.write(
            b"HTTP/1.1 %d OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (status, len(body), body)
        )
        await writer.drain()

    async def _stream(self, writer: asyncio.StreamWriter, usage: bool) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        answer = self.answer
        size = -(-len(answer) // self.pieces)
        events = [_chunk({"role": "assistant", "content": ""})]
        pieces = [_chunk({"content": answer[i : i + size]}) for i in range(0, len(answer), size)]
        gap = self.seconds / len(pieces)
        for event in events + pieces:
            if event is not events[0]:
                await asyncio.sleep(gap)
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
        tail = [_chunk({}, "stop"), *([_usage_chunk()] if usage else []), b"data: [DONE]\n\n"]
        for event in tail:
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
        writer.write(b"0\r\n\r\n")
        await writer.drain()


async def _main(port: int, seconds: float, pieces: int, chars: int) -> None:
    server = _Server(seconds, pieces, answer_of(chars))
    listening = await asyncio.start_server(server.serve, "127.0.0.1", port, backlog=4096)
    print(f"listening on 127.0.0.1:{port}", flush=True)
    async with listening:
        await listening.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.slow_model", description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--pieces", type=int, default=10)
    parser.add_argument("--chars", type=int, default=0)
    args = parser.parse_args(argv)
    asyncio.run(_main(args.port, args.seconds, args.pieces, args.chars))


if __name__ == "__main__":
    main()
