"""Conversation memory without a server: the SQLite store, folding with a scripted model, failures."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.config import ConfigError, SessionConfig
from gateway.llm.base import LLMError
from gateway.llm.conversation import Conversation
from gateway.llm.memory import ConversationMemory, resolve_memory_path
from gateway.llm.memory_store import MemoryStore


class SummaryLLM:
    """Summarises by listing the user's lines; records every request."""

    def __init__(self, *, fail: bool = False, hang: bool = False, chars: int = 0) -> None:
        self.fail, self.hang, self.chars = fail, hang, chars
        self.requests: list[list[dict[str, str]]] = []

    async def stream_chat(self, messages: list[dict[str, str]]) -> AsyncIterator[str]:
        self.requests.append(messages)
        if self.hang:
            await asyncio.Event().wait()
        if self.fail:
            raise LLMError("model down")
        if self.chars:
            for _ in range(self.chars):
                yield "x"
            return
        users = [
            line for line in messages[-1]["content"].splitlines() if line.startswith(("User:", "Earlier"))
        ]
        yield "SUMMARY[" + " | ".join(users) + "]"


def _memory(tmp_path: Path, llm: SummaryLLM, **kw) -> ConversationMemory:
    kw.setdefault("max_messages", 8)
    return ConversationMemory(MemoryStore(tmp_path / "memory.sqlite3"), llm, **kw)


async def _say(memory: ConversationMemory, device: str, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        memory.remember(device, f"question {i}", f"answer {i}")
    await memory.settle()


async def test_exchanges_survive_a_reopen_of_the_file(tmp_path: Path) -> None:
    memory = _memory(tmp_path, SummaryLLM())
    memory.remember("dev-a", "my name is Alice", "Nice to meet you, Alice.")
    await memory.aclose()
    reopened = _memory(tmp_path, SummaryLLM())
    restored = await reopened.restore("dev-a")
    assert restored.turns == (("my name is Alice", "Nice to meet you, Alice."),)
    assert (await reopened.restore("dev-b")).empty
    await reopened.aclose()


async def test_past_the_limit_old_exchanges_are_summarised_and_the_history_stays_bounded(
    tmp_path: Path,
) -> None:
    llm = SummaryLLM()
    memory = _memory(tmp_path, llm, max_messages=8)  # 4 exchanges at most, 2 kept after a fold
    await _say(memory, "dev", 3)
    assert len((await memory.restore("dev")).turns) == 3 and not llm.requests
    await _say(memory, "dev", 1, start=3)
    restored = await memory.restore("dev")
    assert len(llm.requests) == 1
    assert "question 0" in restored.summary and "question 1" in restored.summary
    assert restored.turns == (("question 2", "answer 2"), ("question 3", "answer 3"))
    await _say(memory, "dev", 30, start=4)
    restored = await memory.restore("dev")
    assert len(restored.turns) < memory.max_turns
    assert "question 0" in restored.summary  # carried through later summaries
    assert ("question 33", "answer 33") == restored.turns[-1]
    await memory.aclose()


async def test_a_failing_or_slow_model_leaves_a_truncated_bounded_history(tmp_path: Path) -> None:
    for llm in (SummaryLLM(fail=True), SummaryLLM(hang=True)):
        memory = _memory(tmp_path / str(id(llm)), llm, max_messages=8, summary_timeout_s=0.2)
        await _say(memory, "dev", 20)
        restored = await memory.restore("dev")
        assert llm.requests
        assert restored.summary == ""
        assert 0 < len(restored.turns) < memory.max_turns
        assert restored.turns[-1] == ("question 19", "answer 19")
        await memory.aclose()


async def test_summary_length_is_capped(tmp_path: Path) -> None:
    memory = _memory(tmp_path, SummaryLLM(chars=100_000), max_messages=4, summary_max_chars=300)
    await _say(memory, "dev", 5)
    assert 0 < len((await memory.restore("dev")).summary) <= 300
    await memory.aclose()


async def test_devices_are_kept_apart_and_delete_forgets_one(tmp_path: Path) -> None:
    memory = _memory(tmp_path, SummaryLLM())
    memory.remember("dev-a", "I like tea", "Tea it is.")
    memory.remember("dev-b", "I like coffee", "Coffee it is.")
    assert await memory.delete("dev-a") is True
    assert (await memory.restore("dev-a")).empty
    assert await memory.delete("dev-a") is False
    assert (await memory.restore("dev-b")).turns == (("I like coffee", "Coffee it is."),)
    await memory.aclose()


def test_restored_summary_and_turns_reach_the_model_in_one_system_message() -> None:
    conversation = Conversation("You are Xiaozhi.", max_turns=2)
    conversation.restore("The user is Alice.", [("a", "1"), ("b", "2"), ("c", "3")])
    messages = conversation.messages_for("who am I?")
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert (
        messages[0]["content"].startswith("You are Xiaozhi.")
        and "The user is Alice." in messages[0]["content"]
    )
    assert messages[1]["content"] == "b"
    conversation.clear()
    assert conversation.messages_for("hi") == [
        {"role": "system", "content": "You are Xiaozhi."},
        {"role": "user", "content": "hi"},
    ]


def test_relative_paths_are_under_the_project_root(tmp_path: Path) -> None:
    assert resolve_memory_path("data/memory.sqlite3").parent.parent == Path(__file__).resolve().parent.parent
    assert resolve_memory_path(str(tmp_path / "m.db")) == tmp_path / "m.db"


def test_an_unusable_path_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a folder")
    cfg = SessionConfig(memory="local", memory_path=str(tmp_path / "file" / "memory.sqlite3"))
    with pytest.raises(ConfigError, match="session.memory_path"):
        ConversationMemory.open(cfg, SummaryLLM())
