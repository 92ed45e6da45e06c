"""Conversation memory without a gateway, on both store engines (SQLite, a real PostgreSQL): folding with a
scripted model, failures, and the import of a memory file of gateways before the store."""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.config import SessionConfig
from gateway.llm.base import LLMError
from gateway.llm.conversation import Conversation
from gateway.llm.memory import ConversationMemory, resolve_memory_path
from gateway.llm.memory_store import MEMORY_SCHEMA, MemoryStore
from gateway.store import Store, StoreError

STORE_TEST_SCHEMAS = (MEMORY_SCHEMA,)  # the `store` fixture (tests/store_fixtures.py) registers these


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


def _memory(store: Store, llm: SummaryLLM, **kw) -> ConversationMemory:
    kw.setdefault("max_messages", 8)
    return ConversationMemory(MemoryStore(store), llm, **kw)


async def _say(memory: ConversationMemory, device: str, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        memory.remember(device, f"question {i}", f"answer {i}")
    await memory.settle()


async def test_exchanges_survive_a_reopen_of_the_store(store_url: str) -> None:
    store = Store(store_url, schemas=[MEMORY_SCHEMA])
    await store.open()
    memory = _memory(store, SummaryLLM())
    memory.remember("dev-a", "my name is Alice", "Nice to meet you, Alice.")
    await memory.aclose()
    await store.close()
    store = Store(store_url, schemas=[MEMORY_SCHEMA])
    await store.open()
    reopened = _memory(store, SummaryLLM())
    restored = await reopened.restore("dev-a")
    assert restored.turns == (("my name is Alice", "Nice to meet you, Alice."),)
    assert (await reopened.restore("dev-b")).empty
    await reopened.aclose()
    await store.close()


async def test_past_the_limit_old_exchanges_are_summarised_and_the_history_stays_bounded(
    store: Store,
) -> None:
    llm = SummaryLLM()
    memory = _memory(store, llm, max_messages=8)  # 4 exchanges at most, 2 kept after a fold
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


async def test_a_failing_or_slow_model_leaves_a_truncated_bounded_history(store: Store) -> None:
    for llm in (SummaryLLM(fail=True), SummaryLLM(hang=True)):
        memory = _memory(store, llm, max_messages=8, summary_timeout_s=0.2)
        device = f"dev-{id(llm)}"
        await _say(memory, device, 20)
        restored = await memory.restore(device)
        assert llm.requests
        assert restored.summary == ""
        assert 0 < len(restored.turns) < memory.max_turns
        assert restored.turns[-1] == ("question 19", "answer 19")
        await memory.aclose()


async def test_summary_length_is_capped(store: Store) -> None:
    memory = _memory(store, SummaryLLM(chars=100_000), max_messages=4, summary_max_chars=300)
    await _say(memory, "dev", 5)
    assert 0 < len((await memory.restore("dev")).summary) <= 300
    await memory.aclose()


async def test_devices_are_kept_apart_and_delete_forgets_one(store: Store) -> None:
    memory = _memory(store, SummaryLLM())
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


async def test_an_unusable_store_path_is_a_store_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a folder")
    store = Store(f"sqlite:///{tmp_path}/file/gateway.db", schemas=[MEMORY_SCHEMA])
    with pytest.raises(StoreError, match="store.url: cannot make the folder"):
        await store.open()
    await store.close()


async def test_a_store_that_is_not_open_costs_a_turn_nothing(tmp_path: Path) -> None:
    """Restore gives nothing and remember drops the exchange (both logged); neither raises nor waits."""
    store = Store(f"sqlite:///{tmp_path}/gateway.db", schemas=[MEMORY_SCHEMA])  # never opened
    memory = ConversationMemory.open(SessionConfig(memory="local"), SummaryLLM(), store)
    assert (await memory.restore("dev")).empty
    memory.remember("dev", "hello", "hi")
    await memory.settle()
    await memory.aclose()


# The memory file of gateways before the store, as gateway/llm/memory_store.py made it then.
LEGACY_SCHEMA = """
CREATE TABLE turns (id INTEGER PRIMARY KEY AUTOINCREMENT, device_id TEXT NOT NULL,
                    user_text TEXT NOT NULL, assistant_text TEXT NOT NULL);
CREATE INDEX turns_by_device ON turns (device_id, id);
CREATE TABLE summaries (device_id TEXT PRIMARY KEY, summary TEXT NOT NULL);
"""


def _legacy_file(path: Path) -> Path:
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(LEGACY_SCHEMA)
    db.executemany(
        "INSERT INTO turns (device_id, user_text, assistant_text) VALUES (?, ?, ?)",
        [("dev-a", "my name is Alice", "Hello Alice."), ("dev-b", "I like tea", "Tea it is."),
         ("dev-a", "I have a cat", "Lovely."), ("dev-a", "the cat is Tom", "Hi Tom.")],
    )  # fmt: skip
    db.execute("INSERT INTO summaries VALUES ('dev-a', 'Alice lives in Paris.')")
    db.commit()
    db.close()
    return path


async def test_a_memory_file_of_an_earlier_gateway_is_imported_once(store: Store, tmp_path: Path) -> None:
    path = _legacy_file(tmp_path / "memory.sqlite3")
    copy = tmp_path / "copy.sqlite3"
    shutil.copy(path, copy)
    cfg = SessionConfig(memory="local", memory_path=str(path))
    memory = ConversationMemory.open(cfg, SummaryLLM(), store)
    done = await memory.start()
    assert done is not None and (done.turns, done.summaries, done.already) == (4, 1, False)
    assert not path.exists() and done.renamed_to == tmp_path / "memory.sqlite3.imported"
    restored = await memory.restore("dev-a")
    assert restored.summary == "Alice lives in Paris."
    assert restored.turns == (("my name is Alice", "Hello Alice."), ("I have a cat", "Lovely."),
                              ("the cat is Tom", "Hi Tom."))  # fmt: skip
    assert (await memory.restore("dev-b")).turns == (("I like tea", "Tea it is."),)
    assert await memory.start() is None  # renamed: nothing to import at the next start
    # the same rows again (a copy restored from a backup, another gateway's copy): not imported twice
    again = ConversationMemory.open(SessionConfig(memory="local", memory_path=str(copy)), SummaryLLM(), store)
    second = await again.start()
    assert second is not None and second.already and second.turns == 0
    assert len((await again.restore("dev-a")).turns) == 3
    await memory.aclose()
    await again.aclose()


async def test_a_file_that_is_not_a_memory_file_is_left_alone(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "memory.sqlite3"
    path.write_bytes(b"this is not a database" * 100)
    memory = ConversationMemory.open(
        SessionConfig(memory="local", memory_path=str(path)), SummaryLLM(), store
    )
    done = await memory.start()
    assert done is not None and done.turns == 0 and not done.already and done.renamed_to is None
    assert path.read_bytes() == b"this is not a database" * 100
    await memory.aclose()
