"""Streaming client for OpenAI-compatible ``/chat/completions`` endpoints (OpenAI, vLLM, Ollama, ...).

The answer arrives as Server-Sent Events. httpx splits the body into lines; ``_server_sent_events``
assembles the lines into events as the SSE specification says (``data:`` lines joined by newlines,
a blank line ends an event, lines starting with ``:`` are comments). Each event holds one JSON
chunk whose ``choices[0].delta.content`` is the next piece of the answer; ``data: [DONE]`` ends the
stream. Reasoning text (``reasoning_content``) is never yielded: it is not meant to be spoken.

Every failure becomes an ``LLMError`` whose message names the URL and the cause.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx

from gateway.llm.base import LLMError, validate_messages

__all__ = ["OpenAIChatLLM"]

_BODY_SNIPPET_CHARS = 300


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
        self._timeout = httpx.Timeout(timeout_s)
        self._owns_client = client is None
        self._client = client if client is not None else httpx.AsyncClient(timeout=self._timeout)
        self._closed = False

    @property
    def url(self) -> str:
        return self._url

    async def stream_chat(self, messages: list[dict[str, str]]) -> AsyncIterator[str]:
        """Yield the answer's text deltas (never empty strings); raise ``LLMError`` on failure."""
        if self._closed:
            raise RuntimeError("OpenAIChatLLM is closed")
        validate_messages(messages)
        deltas = self._stream_deltas(messages)
        deadline = asyncio.get_running_loop().time() + self._first_token_timeout_s
        try:
            try:
                async with asyncio.timeout_at(deadline):
                    first = await anext(deltas, None)
            except TimeoutError:
                raise LLMError(
                    f"no answer text from {self._url} within {self._first_token_timeout_s:g} s "
                    "(first-token timeout)"
                ) from None
            if first is None:
                return
            yield first
            async for delta in deltas:
                yield delta
        finally:
            await deltas.aclose()

    async def aclose(self) -> None:
        """Close the HTTP client if this object created it; the object cannot be used afterwards."""
        self._closed = True
        if self._owns_client:
            await self._client.aclose()

    async def __aenter__(self) -> OpenAIChatLLM:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def _request_body(self, messages: list[dict[str, str]]) -> dict[str, Any]:
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

    async def _stream_deltas(self, messages: list[dict[str, str]]) -> AsyncIterator[str]:
        body = self._request_body(messages)
        try:
            async with self._client.stream(
                "POST", self._url, json=body, headers=self._headers(), timeout=self._timeout
            ) as response:
                if response.status_code >= 400:
                    await response.aread()
                    raise LLMError(
                        f"{self._url} answered HTTP {response.status_code}: {_snippet(response.text)}"
                    )
                if response.headers.get("content-type", "").startswith("application/json"):
                    # The server ignored stream=true and sent the whole completion at once.
                    await response.aread()
                    text = _message_content(_parse_json(response.text, self._url))
                    if text:
                        yield text
                    return
                async for event, data in _server_sent_events(response.aiter_lines()):
                    if data == "[DONE]":
                        return
                    if event == "error":
                        raise LLMError(f"{self._url} sent an error event: {_snippet(data)}")
                    text = _delta_content(_parse_json(data, self._url), self._url)
                    if text:
                        yield text
        except httpx.TimeoutException as exc:
            raise LLMError(
                f"request to {self._url} timed out ({type(exc).__name__}, limit {self._timeout_s:g} s)"
            ) from exc
        except httpx.HTTPError as exc:
            raise LLMError(f"request to {self._url} failed: {type(exc).__name__}: {exc}") from exc


async def _server_sent_events(lines: AsyncIterator[str]) -> AsyncIterator[tuple[str, str]]:
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


def _delta_content(chunk: Any, url: str) -> str:
    if not isinstance(chunk, dict):
        raise LLMError(f"unexpected chunk from {url}: {_snippet(json.dumps(chunk))}")
    if chunk.get("error"):
        raise LLMError(f"{url} reported an error mid-stream: {_snippet(json.dumps(chunk['error']))}")
    choices = chunk.get("choices")
    if not choices:
        return ""  # e.g. the final usage chunk
    choice = choices[0]
    if not isinstance(choice, dict):
        raise LLMError(f"unexpected chunk from {url}: {_snippet(json.dumps(chunk))}")
    delta = choice.get("delta") or {}
    content = delta.get("content") if isinstance(delta, dict) else None
    return content if isinstance(content, str) else ""


def _message_content(completion: Any) -> str:
    try:
        content = completion["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise LLMError(f"unexpected completion: {_snippet(json.dumps(completion))}") from None
    return content if isinstance(content, str) else ""


def _snippet(text: str) -> str:
    flat = " ".join(text.split())
    if len(flat) > _BODY_SNIPPET_CHARS:
        return flat[:_BODY_SNIPPET_CHARS] + "..."
    return flat or "(empty body)"
