"""``tts.text_normalization`` switches what the engine hands the backend, on every path.

A recording fake backend shows the text the engine gives it: from a device turn (echo LLM, real
WebSocket), from the HTTP API and from the ``/ws/tts`` socket, for ``wetext``, ``basic`` and ``off``.
"""

from __future__ import annotations

import json
import logging
import sys

import httpx
import pytest
import websockets

from cosyvoice.text.numbers import spell_numbers_zh
from scripts.device_sim import DeviceSimulator
from tests.gateway_server import running_gateway
from tts_engine import TTSEngine
from tts_engine.backends.espeak import EspeakBackend
from tts_engine.backends.fake import FakeBackend
from tts_engine.text_normalization import TextNormalizer

SENTENCE = "会议在2026-11-24下午3:30，预计3-5个人。"
WETEXT = "会议在二零二六年十一月二十四日下午三点三十分，预计三到五个人。"


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every text a FakeBackend is asked to speak, in order."""
    texts: list[str] = []
    original = FakeBackend.open_stream

    def recording(self: FakeBackend, text: str, *args: object):
        texts.append(text)
        return original(self, text, *args)

    monkeypatch.setattr(FakeBackend, "open_stream", recording)
    return texts


def _expected(mode: str) -> str:
    if mode == "wetext":
        pytest.importorskip("wetext")
        return WETEXT
    return spell_numbers_zh(SENTENCE) if mode == "basic" else SENTENCE


@pytest.mark.parametrize("mode", ["wetext", "basic", "off"])
async def test_device_turn_and_api_get_normalised_text(mode: str, opened: list[str]) -> None:
    expected = _expected(mode)
    # the audio cache off: the same sentence three times must reach the engine three times
    overrides = {"tts": {"backend": "fake", "text_normalization": mode}, "cache": {"enabled": False}}
    async with running_gateway(overrides) as gw:
        assert gw.services.engine.text_normalization == mode
        sim = DeviceSimulator(gw.url)
        await sim.connect()
        await sim.listen_start("auto")
        turn = await sim.ask(SENTENCE)
        await sim.close()
        assert turn.stt == SENTENCE
        assert SENTENCE in turn.sentences  # the device's screen shows what the LLM wrote
        assert opened[-1] == expected  # after the echo LLM's own opening words
        del opened[:]

        async with httpx.AsyncClient(timeout=30) as client:
            reply = await client.post(f"{gw.url}/v1/tts", json={"text": SENTENCE})
            assert reply.status_code == 200
            reply = await client.post(f"{gw.url}/v1/audio/speech", json={"input": SENTENCE, "model": "tts-1"})
            assert reply.status_code == 200
        async with websockets.connect(gw.url.replace("http", "ws", 1) + "/ws/tts") as ws:
            await ws.send(json.dumps({"text": SENTENCE}))
            while json.loads(await ws.recv())["type"] != "done":
                pass
        assert opened == [expected] * 3


def test_basic_is_our_normaliser_and_off_is_identity() -> None:
    text = "Call me at 3:30, it costs $20. 价格是¥1234.5，增长50%。<|endofprompt|> stays"
    assert TextNormalizer("off")(text) == text
    plain = "Call me at 3:30, it costs $20. 价格是¥1234.5，增长50%。"
    assert TextNormalizer("basic")(plain) == (
        "Call me at three thirty, it costs twenty dollars. 价格是一千二百三十四点五元，增长百分之五十。"
    )
    with pytest.raises(ValueError, match="wetext, basic, off"):
        TextNormalizer("fancy")


def test_wetext_missing_falls_back_to_basic_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "wetext", None)  # import wetext -> ImportError
    with caplog.at_level(logging.WARNING, logger="tts_engine.text_normalization"):
        normalizer = TextNormalizer("wetext")
    assert normalizer.mode == "basic"
    assert "wetext" in caplog.text and "basic" in caplog.text
    assert normalizer("增长50%") == "增长百分之五十"


def test_espeak_reads_the_text_as_written() -> None:
    """espeak-ng reads digits itself; the Chinese normaliser's output is worse for its dictionary."""
    engine = TTSEngine(EspeakBackend(), text_normalizer=TextNormalizer("basic"))
    assert engine.text_normalization == "off"
    assert TTSEngine(FakeBackend(), text_normalizer=TextNormalizer("basic")).text_normalization == "basic"
