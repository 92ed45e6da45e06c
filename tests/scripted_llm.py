"""A scripted OpenAI-compatible chat server on loopback: real HTTP and SSE, for tool-calling tests.

Each POST to ``/v1/chat/completions`` plays the next script (a list of chunk dicts streamed as SSE
events, then ``data: [DONE]``) and records the request body. Helpers build the chunks the way
OpenAI streams them, e.g. a tool call whose arguments arrive split across chunks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

Chunk = dict[str, Any]


def text(content: str) -> Chunk:
    return {"choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}]}


def tool(
    index: int, *, id: str | None = None, name: str | None = None, arguments: str | None = None
) -> Chunk:
    """One piece of a streamed tool call."""
    piece: dict[str, Any] = {"index": index}
    function: dict[str, str] = {}
    if id is not None:
        piece["id"], piece["type"] = id, "function"
    if name is not None:
        function["name"] = name
    if arguments is not None:
        function["arguments"] = arguments
    if function:
        piece["function"] = function
    return {"choices": [{"index": 0, "delta": {"tool_calls": [piece]}, "finish_reason": None}]}


def finish(reason: str = "stop") -> Chunk:
    return {"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]}


def answer(*texts: str) -> list[Chunk]:
    return [*(text(t) for t in texts), finish()]


def call(name: str, arguments: str, *, id: str = "call_1", split: int = 3) -> list[Chunk]:
    """A single tool call with its arguments cut into ``split``-character pieces."""
    pieces = [arguments[i : i + split] for i in range(0, len(arguments), split)] or [""]
    return [
        tool(0, id=id, name=name, arguments=""),
        *(tool(0, arguments=p) for p in pieces),
        finish("tool_calls"),
    ]


@dataclass
class Status:
    """A script that answers an HTTP error instead of a stream."""

    code: int = 500


@dataclass
class ScriptedLLM:
    scripts: list[list[Chunk] | Status] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    base_url: str = ""
    chunk_delay_s: float = 0.0

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def completions(request: Request) -> Any:
            self.requests.append(await request.json())
            script = self.scripts.pop(0) if self.scripts else answer("OK.")
            if isinstance(script, Status):
                return JSONResponse({"error": {"message": "scripted failure"}}, status_code=script.code)
            return StreamingResponse(self._events(script), media_type="text/event-stream")

        return app

    async def _events(self, chunks: list[Chunk]) -> AsyncIterator[str]:
        for chunk in chunks:
            if self.chunk_delay_s:
                await asyncio.sleep(self.chunk_delay_s)
            yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
        yield "data: [DONE]\n\n"


@contextlib.asynccontextmanager
async def scripted_llm(*scripts: list[Chunk] | Status) -> AsyncIterator[ScriptedLLM]:
    """Serves a ``ScriptedLLM`` on a free loopback port in the running loop."""
    llm = ScriptedLLM(scripts=list(scripts))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    llm.base_url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    server = uvicorn.Server(uvicorn.Config(llm.app(), log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        yield llm
    finally:
        server.should_exit = True
        await task
        sock.close()
