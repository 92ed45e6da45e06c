"""A Session on a fake socket (a list of what it sent) with a fake engine: the order of its events.

No server and no network: the socket decodes what the session sends with a device-side connection,
so the traces are the protocol's messages (docs/xiaozhi-protocol.md §10).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from gateway.config import Config
from gateway.device.registry import SessionRegistry
from gateway.device.session import Session
from gateway.llm.tool_calls import ToolCall
from gateway.services import Services
from gateway.xiaozhi import (
    Abort,
    AudioOut,
    HandshakeInfo,
    Hello,
    Listen,
    ListenState,
    Role,
    ServerHello,
    XiaozhiConnection,
)
from tests.turn_fakes import FakeEngine, ScriptedLLM, names, sentences

FIRST = "今天的天气很好阳光明媚。"
SECOND = "明天也是一个好天气。"


class ListSocket:
    """The session's socket: what it sends is decoded into `sent`; `put` is the device sending."""

    def __init__(self) -> None:
        self._device = XiaozhiConnection(Role.DEVICE, binary_version=1)
        self._inbox: asyncio.Queue[str | bytes | None] = asyncio.Queue()
        self._changed = asyncio.Condition()
        self.sent: list[object] = []
        self.closed = False

    def put(self, event: object) -> None:
        self._inbox.put_nowait(self._device.send(event))

    async def wait_for(self, done: Callable[[list[str]], bool], timeout: float = 10) -> None:
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: done(names(self.sent)))

    async def wait_closed(self, timeout: float = 10) -> None:
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: self.closed)

    async def _record(self, event: object) -> None:
        async with self._changed:
            self.sent.append(event)
            self._changed.notify_all()

    async def receive(self) -> str | bytes | None:
        return await self._inbox.get()

    async def send_text(self, text: str) -> None:
        await self._record(self._device.receive_text(text))

    async def send_bytes(self, data: bytes) -> None:
        await self._record(AudioOut(opus=self._device.receive_binary(data).opus))

    async def close(self, code: int = 1000) -> None:
        self.closed = True
        self._inbox.put_nowait(None)
        async with self._changed:
            self._changed.notify_all()


@asynccontextmanager
async def session_on_list(
    llm: ScriptedLLM, engine: FakeEngine | None = None, **sections: dict[str, Any]
) -> AsyncIterator[tuple[Session, ListSocket, FakeEngine]]:
    audio = {"start_gap_ms": 0, "stop_margin_ms": 0, "prebuffer_frames": 30}
    config = Config.model_validate({"asr": {"backend": "none"}, "audio": audio, **sections})
    engine = engine or FakeEngine()
    services = Services.build(config, engine=engine, llm=llm)  # type: ignore[arg-type]
    socket = ListSocket()
    session = Session(socket, HandshakeInfo("dev-1", "client-1", None, 1), services)
    task = asyncio.create_task(session.run())
    socket.put(Hello(version=1, features={}))
    await socket.wait_for(lambda trace: "ServerHello" in trace)
    try:
        yield session, socket, engine
    finally:
        await session.close()
        await asyncio.wait_for(task, 10)


def typed(text: str) -> Listen:
    return Listen(state=ListenState.DETECT, text=text)


def turn_over(trace: list[str], stops: int = 1) -> bool:
    return trace.count("tts stop") >= stops


async def test_a_typed_query_gets_stt_start_emotion_sentences_audio_stop() -> None:
    async with session_on_list(ScriptedLLM(["😆", FIRST, SECOND])) as (session, socket, _):
        socket.put(typed("天气怎么样"))
        await socket.wait_for(turn_over)
    assert isinstance(socket.sent[0], ServerHello)
    assert names(socket.sent)[1:] == ["stt", "tts start", "emotion", "sentence", "audio", "sentence", "audio",
                                      "tts stop"]  # fmt: skip
    assert sentences(socket.sent) == [FIRST, SECOND]
    assert (
        session.conversation.messages_for("x")[-3]["content"] == "天气怎么样"
    )  # the exchange is in the history


async def test_abort_mid_reply_ends_with_one_tts_stop_and_no_audio_after_it() -> None:
    engine = FakeEngine(hang=(SECOND,))
    llm = ScriptedLLM([FIRST, SECOND], ["好的。"])
    async with session_on_list(llm, engine) as (_, socket, _):
        socket.put(typed("讲个故事"))
        await socket.wait_for(lambda trace: trace.count("sentence") == 2 and trace[-1] == "audio")
        socket.put(Abort())
        await socket.wait_for(turn_over)
        await asyncio.sleep(0.2)  # anything the cancelled turn could still send would be here now
        aborted = names(socket.sent)
        socket.put(typed("继续"))  # the session goes on
        await socket.wait_for(lambda trace: turn_over(trace, 2))
    assert aborted[-1] == "tts stop" and aborted.count("tts stop") == 1
    assert names(socket.sent)[len(aborted) :] == [
        "stt",
        "tts start",
        "emotion",
        "sentence",
        "audio",
        "tts stop",
    ]


async def test_a_new_query_mid_reply_stops_the_old_reply_before_its_stt() -> None:
    engine = FakeEngine(hang=(FIRST,))
    async with session_on_list(ScriptedLLM([FIRST], [SECOND]), engine) as (_, socket, _):
        socket.put(typed("第一个问题"))
        await socket.wait_for(lambda trace: "audio" in trace)
        socket.put(typed("第二个问题"))
        await socket.wait_for(lambda trace: turn_over(trace, 2))
    trace = names(socket.sent)
    first_stop = trace.index("tts stop")
    assert trace[first_stop + 1 :] == ["stt", "tts start", "emotion", "sentence", "audio", "tts stop"]
    assert "audio" not in trace[first_stop + 1 : trace.index("sentence", first_stop)]


async def test_the_wake_word_gets_the_greeting_without_the_llm() -> None:
    llm = ScriptedLLM()
    session_cfg = {"wake_words": ["你好小智"], "greeting": "你好，我在呢。"}
    async with session_on_list(llm, session=session_cfg) as (_, socket, _):
        socket.put(typed("你好小智"))
        await socket.wait_for(turn_over)
    assert names(socket.sent)[1:] == ["tts start", "sentence", "audio", "tts stop"]
    assert sentences(socket.sent) == ["你好，我在呢。"] and llm.requests == []


async def test_the_change_voice_tool_changes_the_voice_of_what_follows() -> None:
    llm = ScriptedLLM([[ToolCall("c1", "change_voice", json.dumps({"voice": "other"}))]], [FIRST], [SECOND])
    async with session_on_list(llm) as (_, socket, engine):
        socket.put(typed("换个声音"))
        await socket.wait_for(turn_over)
        socket.put(typed("再说一句"))
        await socket.wait_for(lambda trace: turn_over(trace, 2))
    assert engine.texts == [FIRST, SECOND] and engine.voices_used == ["other", "other"]
    assert llm.requests[1][-1]["role"] == "tool" and "other" in llm.requests[1][-1]["content"]


async def test_the_end_conversation_tool_closes_the_session_after_the_goodbye() -> None:
    llm = ScriptedLLM([[ToolCall("c1", "end_conversation", "{}")]], ["再见，下次聊。"])
    async with session_on_list(llm) as (_, socket, _):
        socket.put(typed("我要走了"))
        await socket.wait_closed()
    assert names(socket.sent)[-3:] == ["sentence", "audio", "tts stop"]
    assert sentences(socket.sent) == ["再见，下次聊。"]


class _Info:
    def __init__(self, authenticated: bool) -> None:
        self.authenticated = authenticated


class _Session:
    def __init__(self, authenticated: bool = False) -> None:
        self.info = _Info(authenticated)
        self.closed = False

    async def close(self) -> None:
        self.closed = True


async def test_the_registry_replaces_a_device_session_and_keeps_the_newer_one() -> None:
    registry = SessionRegistry()
    old, new = _Session(), _Session()
    assert registry.key_for("dev") == "dev" and registry.key_for(None) != registry.key_for(None)
    assert registry.claim("dev", old) is None  # type: ignore[arg-type]
    assert registry.claim("dev", new) is old  # type: ignore[arg-type]
    registry.release("dev", old)  # type: ignore[arg-type]  # the old one ending leaves the new one in place
    assert registry["dev"] is new and len(registry) == 1
    await registry.close_all()
    assert new.closed
    registry.release("dev", new)  # type: ignore[arg-type]
    assert "dev" not in registry


def test_only_a_token_replaces_a_session_that_had_one() -> None:
    registry = SessionRegistry()
    registry.claim("dev", _Session(authenticated=True))  # type: ignore[arg-type]
    assert not registry.may_replace("dev", authenticated=False)
    assert registry.may_replace("dev", authenticated=True) and registry.may_replace(
        "other", authenticated=False
    )
