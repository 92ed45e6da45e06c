"""Streaming client for OpenAI-compatible ``/chat/completions`` endpoints (OpenAI, vLLM, Ollama, ...).

The answer arrives as Server-Sent Events. httpx splits the body into lines; ``_server_sent_events``
assembles the lines into events as the SSE specification says (``data:`` lines joined by newlines,
a blank line ends an event, lines starting with ``:`` are comments). Each event holds one JSON
chunk whose ``choices[0].delta.content`` is the next piece of the answer; ``data: [DONE]`` ends the
stream. Reasoning text (``reasoning_content``) is never yielded: it is not meant to be spoken.

Function calling (``stream_round``): the request offers ``tools``; ``delta.tool_calls`` pieces are
assembled into whole calls (gateway/llm/tool_calls.py) and yielded after the text. The loop that runs
the calls and asks again lives in gateway/tools/runner.py. A server that rejects ``tools`` with HTTP 400
(e.g. vLLM started without ``--enable-auto-tool-choice``) is asked again without them, and from then
on never offered tools (logged once): its answers are spoken as before.

Every failure becomes an ``LLMError`` whose message names the URL and the cause.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import httpx

from gateway.llm.base import LLMError, validate_messages
from gateway.llm.tool_calls import ToolCall, ToolCallAssembler

__all__ = ["OpenAIChatLLM"]

log = logging.getLogger(__name__)

_BODY_SNIPPET_CHARS = 300


class _HTTPStatusError(LLMError):
    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class OpenAIChatLLM:
    """Chat model behind an OpenAI-compatible HTTP API.

    ``timeout_s`` bounds connecting, sending and each wait for more of the stream;
    ``first_token_timeout_s`` bounds the time from the request to the first piece of answer text.
    A ``client`` passed in is used as is and not closed by ``aclose()``.
    """

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str | None,
        model: str,
        timeout_s: float = 30.0,
        first_token_timeout_s: float = 15.0,
        temperature: float | None = None,
        max_tokens: int | None = None,
        client: httpx.AsyncClient | None = None,
        max_tool_calls: int = 8,
        max_tool_argument_chars: int = 8192,
    ):
        if not base_url or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL, got {base_url!r}")
        if not model:
            raise ValueError("model must not be empty")
        if timeout_s <= 0 or first_token_timeout_s <= 0:
            raise ValueError("timeout_s and first_token_timeout_s must be positive")
        if max_tokens is not None and max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        self._url = base_url.rstrip("/") + "/chat/completions"
        self._api_key = api_key
        self._model = model
        self._timeout_s = timeout_s
        self._first_token_timeout_s = first_token_timeout_s
        self._temperature = temperature
        self._max_tokens = max_tokens
        self._max_tool_calls = max_tool_calls
        self._max_tool_argument_chars = max_tool_argument_chars
        self._tools_rejected = False  # the server answered HTTP 400 to a request with tools
        self._timeout = httpx.Timeout(timeout_s)
        self._owns_client = client is None
        self._client = client if client is not None else httpx.AsyncClient(timeout=self._timeout)
        self._closed = False

    @property
    def url(self) -> str:
        return self._url

    async def stream_chat(self, messages: list[dict[str, str]]) -> AsyncGenerator[str, None]:
        """Yield the answer's text deltas (never empty strings); raise ``LLMError`` on failure."""
        self._check_open()
        validate_messages(messages)
        items = self._first_within_timeout(self._stream_items(self._request_body(messages)))
        async with contextlib.aclosing(items):  # a consumer that stops early closes the response
            async for item in items:
                if isinstance(item, str):
                    yield item

    async def stream_round(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], *, tool_choice: str = "auto"
    ) -> AsyncGenerator[str | list[ToolCall], None]:
        """One round of a turn with tools: text deltas, then the list of calls if the model made any.

        ``messages`` may hold assistant ``tool_calls`` and ``tool`` results; ``tool_choice: none``
        forbids calls (the last round of a turn). The first-token timeout covers text and calls alike.
        """
        self._check_open()
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise ValueError("messages must be a non-empty list of dicts")
        body = self._request_body(messages)
        if tools and not self._tools_rejected:
            body["tools"] = tools
            body["tool_choice"] = tool_choice
        calls = ToolCallAssembler(max_calls=self._max_tool_calls, max_chars=self._max_tool_argument_chars)
        items = self._round_items(body)
        async with contextlib.aclosing(items):
            async for item in items:
                if isinstance(item, str):
                    yield item
                else:
                    calls.feed(item)
        if calls.skipped:
            log.warning("%s: %d malformed or surplus tool-call pieces skipped", self._url, calls.skipped)
        if calls:
            yield calls.calls()

    async def _round_items(self, body: dict[str, Any]) -> AsyncGenerator[str | list[Any], None]:
        """The round's items; asked again without tools if the server rejects them (HTTP 400)."""
        items = self._first_within_timeout(self._stream_items(body))
        try:
            first = await anext(items, None)
        except _HTTPStatusError as exc:
            if exc.status != 400 or "tools" not in body:
                raise
            log.warning("%s rejected the tools (%s); asking without tools from now on", self._url, exc)
            self._tools_rejected = True
            body = {k: v for k, v in body.items() if k not in ("tools", "tool_choice")}
            items = self._first_within_timeout(self._stream_items(body))
            first = await anext(items, None)
        async with contextlib.aclosing(items):
            if first is None:
                return
            yield first
            async for item in items:
                yield item

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("OpenAIChatLLM is closed")

    async def _first_within_timeout(self, items: AsyncGenerator[Any, None]) -> AsyncGenerator[Any, None]:
        deadline = asyncio.get_running_loop().time() + self._first_token_timeout_s
        try:
            try:
                async with asyncio.timeout_at(deadline):
                    first = await anext(items, None)
            except TimeoutError:
                raise LLMError(
                    f"no answer text from {self._url} within {self._first_token_timeout_s:g} s "
                    "(first-token timeout)"
                ) from None
            if first is None:
                return
            yield first
            async for item in items:
                yield item
        finally:
            await items.aclose()

    async def aclose(self) -> None:
        """Close the HTTP client if this object created it; the object cannot be used afterwards."""
        self._closed = True
        if self._owns_client:
            await self._client.aclose()

    async def __aenter__(self) -> OpenAIChatLLM:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def _request_body(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self._model, "messages": messages, "stream": True}
        if self._temperature is not None:
            body["temperature"] = self._temperature
        if self._max_tokens is not None:
            body["max_tokens"] = self._max_tokens
        return body

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "text/event-stream"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    async def _stream_items(self, body: dict[str, Any]) -> AsyncGenerator[str | list[Any], None]:
        """Text deltas (str) and raw ``delta.tool_calls`` pieces (list) in stream order."""
        try:
            async with self._client.stream(
                "POST", self._url, json=body, headers=self._headers(), timeout=self._timeout
            ) as response:
                if response.status_code >= 400:
                    await response.aread()
                    raise _HTTPStatusError(
                        f"{self._url} answered HTTP {response.status_code}: {_snippet(response.text)}",
                        response.status_code,
                    )
                if response.headers.get("content-type", "").startswith("application/json"):
                    # The server ignored stream=true and sent the whole completion at once.
                    await response.aread()
                    message = _message(_parse_json(response.text, self._url))
                    text = message.get("content")
                    if isinstance(text, str) and text:
                        yield text
                    pieces = message.get("tool_calls")
                    if isinstance(pieces, list) and pieces:  # whole calls carry no index: number them
                        yield [{**p, "index": i} if isinstance(p, dict) else p for i, p in enumerate(pieces)]
                    return
                async for event, data in _server_sent_events(response.aiter_lines()):
                    if data == "[DONE]":
                        return
                    if event == "error":
                        raise LLMError(f"{self._url} sent an error event: {_snippet(data)}")
                    delta = _delta(_parse_json(data, self._url), self._url)
                    text = delta.get("content")
                    if isinstance(text, str) and text:
                        yield text
                    pieces = delta.get("tool_calls")
                    if pieces:
                        yield pieces if isinstance(pieces, list) else [pieces]
        except httpx.TimeoutException as exc:
            raise LLMError(
                f"request to {self._url} timed out ({type(exc).__name__}, limit {self._timeout_s:g} s)"
            ) from exc
        except httpx.HTTPError as exc:
            raise LLMError(f"request to {self._url} failed: {type(exc).__name__}: {exc}") from exc


async def _server_sent_events(lines: AsyncIterator[str]) -> AsyncGenerator[tuple[str, str], None]:
    """Group SSE lines into (event type, data) pairs."""
    event = ""
    data_lines: list[str] = []
    async for raw_line in lines:
        line = raw_line.rstrip("\r\n")
        if not line:
            if data_lines:
                yield event or "message", "\n".join(data_lines)
            event, data_lines = "", []
            continue
        if line.startswith(":"):
            continue  # comment, often a keep-alive
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "data":
            data_lines.append(value)
        elif field == "event":
            event = value
        # "id" and "retry" mean nothing for a single chat completion.
    if data_lines:  # tolerate a stream whose last event lacks the closing blank line
        yield event or "message", "\n".join(data_lines)


def _parse_json(data: str, url: str) -> Any:
    try:
        return json.loads(data)
    except json.JSONDecodeError as exc:
        raise LLMError(f"malformed JSON from {url}: {exc.msg}: {_snippet(data)}") from None


def _delta(chunk: Any, url: str) -> dict[str, Any]:
    if not isinstance(chunk, dict):
        raise LLMError(f"unexpected chunk from {url}: {_snippet(json.dumps(chunk))}")
    if chunk.get("error"):
        raise LLMError(f"{url} reported an error mid-stream: {_snippet(json.dumps(chunk['error']))}")
    choices = chunk.get("choices")
    if not choices:
        return {}  # e.g. the final usage chunk
    choice = choices[0]
    if not isinstance(choice, dict):
        raise LLMError(f"unexpected chunk from {url}: {_snippet(json.dumps(chunk))}")
    delta = choice.get("delta")
    return delta if isinstance(delta, dict) else {}


def _message(completion: Any) -> dict[str, Any]:
    try:
        message = completion["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        raise LLMError(f"unexpected completion: {_snippet(json.dumps(completion))}") from None
    if not isinstance(message, dict):
        raise LLMError(f"unexpected completion: {_snippet(json.dumps(completion))}")
    return message


def _snippet(text: str) -> str:
    flat = " ".join(text.split())
    if len(flat) > _BODY_SNIPPET_CHARS:
        return flat[:_BODY_SNIPPET_CHARS] + "..."
    return flat or "(empty body)"
