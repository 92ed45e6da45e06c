"""A turn with tools: ask the model, run the calls it makes, give it the results, ask again.

``answer_with_tools`` yields the answer's text deltas as they stream, ``ToolsRunning`` when a round's
calls start (text said before them is complete: speak it now, in the voice of that moment), and a
``Filler`` when they take longer than ``filler_after_s`` (spoken while they run; not part of the
answer).
The calls of one round run in parallel in a task group, each bounded by ``call_timeout_s``; a failed
call's result tells the model it failed. ``on_call`` hears of each call (its source, ``ok``, ``failed``
or ``timeout``, and its seconds), for the metrics. The generator owns that task: cancelling the consumer or
closing the generator cancels the running calls. At most ``max_rounds`` rounds of calls; the request
after the last one forbids calls (``tool_choice: none``), so a turn always ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any

from gateway.llm.tool_calls import ToolCall, ToolCallingLLM, assistant_message, tool_message
from gateway.tools.toolset import ToolResult, ToolSet

__all__ = ["Filler", "OnToolCall", "ToolLoopSettings", "ToolsRunning", "answer_with_tools"]

OnToolCall = Callable[[str, str, float], None]  # (source name, outcome, seconds)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ToolLoopSettings:
    max_rounds: int = 3  # rounds of tool calls per turn
    call_timeout_s: float = 10.0
    filler_after_s: float = 1.5
    filler: str = "请稍等。"


@dataclass(frozen=True)
class ToolsRunning:
    """The round's tool calls start now."""


@dataclass(frozen=True)
class Filler:
    """A short sentence to speak while slow tools run."""

    text: str


async def answer_with_tools(
    llm: ToolCallingLLM,
    messages: list[dict[str, Any]],
    tools: ToolSet,
    settings: ToolLoopSettings,
    on_call: OnToolCall | None = None,
) -> AsyncGenerator[str | ToolsRunning | Filler, None]:
    """The answer to ``messages`` with ``tools`` offered (raises ``LLMError`` if a round fails)."""
    messages = list(messages)
    offered = tools.openai_tools()
    filler_said = False
    for round_no in range(settings.max_rounds + 1):
        last = round_no == settings.max_rounds
        text: list[str] = []
        calls: list[ToolCall] = []
        rounds = llm.stream_round(messages, offered, tool_choice="none" if last else "auto")
        async with contextlib.aclosing(rounds):
            async for item in rounds:
                if isinstance(item, str):
                    text.append(item)
                    yield item
                else:
                    calls = item
        if not calls:
            return
        if last:
            log.warning("tool calls after the last round (%d) ignored", settings.max_rounds)
            return
        messages.append(assistant_message("".join(text), calls))
        yield ToolsRunning()
        running = asyncio.ensure_future(_run_calls(tools, calls, settings.call_timeout_s, on_call))
        try:
            done, _ = await asyncio.wait({running}, timeout=settings.filler_after_s)
            if not done and not filler_said and settings.filler:
                filler_said = True
                yield Filler(settings.filler)
            results = await running
        finally:
            if not running.done():  # the turn was cancelled or the generator closed
                running.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await running
        messages.extend(tool_message(call, result.text) for call, result in zip(calls, results, strict=True))


async def _run_calls(
    tools: ToolSet, calls: list[ToolCall], timeout_s: float, on_call: OnToolCall | None = None
) -> list[ToolResult]:
    async def one(call: ToolCall) -> ToolResult:
        started = time.monotonic()
        try:
            async with asyncio.timeout(timeout_s):
                result = await tools.call(call.name, call.arguments)
            outcome = "ok" if result.ok else "failed"
        except TimeoutError:
            result, outcome = tools.failed(call.name, f"no answer within {timeout_s:g} s"), "timeout"
        if on_call is not None:
            source = tools.original(call.name)
            on_call(source[0] if source else "unknown", outcome, time.monotonic() - started)
        return result

    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(one(call)) for call in calls]
    return [task.result() for task in tasks]
