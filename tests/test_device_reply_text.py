"""An LLM reply with lone surrogates and unspeakable sentences: a real loopback device hears the rest.

A lone surrogate cannot be sent in a WebSocket text frame (it is not UTF-8) nor given to a TTS, and
a sentence of only emoji or punctuation has nothing to say: the device path drops both and speaks
the other sentences; the turn ends normally and the next turn works.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from gateway.xiaozhi import AudioOut, Stt, TtsSentenceStart, TtsStart, TtsStop
from scripts.device_sim import DeviceSimulator
from tests.api_helpers import fake
from tests.gateway_server import running_gateway

REPLY = ["\ud800好", "的。😊🎉。…", "…\n!!\nOK\udfff then", ". Bye\ud83d!"]


class ScriptedLLM:
    """Answers every question with ``REPLY``, one delta at a time."""

    async def stream_chat(self, messages: list[dict[str, str]]) -> AsyncIterator[str]:
        for delta in REPLY:
            yield delta

    async def aclose(self) -> None:
        pass


async def test_unspeakable_parts_of_a_reply_are_dropped_and_the_turn_ends():
    async with running_gateway(backend=fake(), llm=ScriptedLLM()) as gw:
        sim = DeviceSimulator(gw.url, protocol_version=1)
        await sim.connect()
        await sim.listen_start("auto")
        first = await sim.ask("hello", timeout=15)
        second = await sim.ask("again", timeout=15)
        await sim.close()
    for turn in (first, second):
        events = [e for e in turn.events if not isinstance(e, AudioOut)]
        assert (
            isinstance(events[0], Stt) and isinstance(events[1], TtsStart) and isinstance(events[-1], TtsStop)
        )
        spoken = [e.text for e in events if isinstance(e, TtsSentenceStart)]
        assert spoken == ["好的。", "OK then.", "Bye!"]
        assert any(isinstance(e, AudioOut) for e in turn.events)


async def test_typed_text_with_a_lone_surrogate_gets_its_reply():
    # `{"type":"listen","state":"detect","text":"\ud800 hi"}`: the lone surrogate could not be echoed
    # in `stt` (not UTF-8), so the turn used to fail silently. It is read as U+FFFD.
    async with running_gateway(backend=fake()) as gw:
        sim = DeviceSimulator(gw.url, protocol_version=1)
        await sim.connect()
        await sim.listen_start("auto")
        t = time.monotonic()
        await sim.send_raw('{"type":"listen","state":"detect","text":"\\ud800 hi"}')
        turn = await sim.collect_turn(t, timeout=15)
        await sim.close()
    events = [e for e in turn.events if not isinstance(e, AudioOut)]
    assert isinstance(events[0], Stt) and events[0].text == "\ufffd hi"
    assert isinstance(events[1], TtsStart) and isinstance(events[-1], TtsStop)
    assert any(isinstance(e, AudioOut) for e in turn.events)
