"""The web console (/console) in headless Chromium against a real gateway on loopback.

The microphone is Chromium's fake capture device playing an espeak-ng utterance from a WAV; the
page encodes it with WebCodecs (Opus), the gateway's real Silero VAD cuts the utterance and a
stand-in recogniser (as in tests/test_listen_modes.py) names it; the fake TTS backend answers.
"""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest

from scripts.speech import RATE, utterance
from tests.api_helpers import CloningFakeBackend, prompt_wav
from tests.console_browser import chromium_page, require_browser, screenshot
from tests.gateway_server import running_gateway
from tts_engine.backends.fake import FakeBackend

QUERY = "What is the weather like today?"
VAD = {"min_silence_ms": 400, "min_speech_ms": 160, "pre_roll_ms": 300, "detect_mute_s": 0.6}


@pytest.fixture(autouse=True)
def _browser() -> None:
    require_browser()


class FixedASR:
    """Recognises every utterance as QUERY and counts the calls."""

    name = "fixed"

    def __init__(self) -> None:
        self.calls = 0

    async def transcribe(self, pcm16k: np.ndarray) -> str:
        self.calls += 1
        return QUERY

    async def aclose(self) -> None:
        return None


def mic_wav(tmp_path: Path) -> Path:
    speech = utterance(QUERY, lead_s=0.6, tail_s=3.0)
    path = tmp_path / "mic.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(speech.pcm.astype("<i2").tobytes())
    return path


def gateway(**overrides):
    cfg = {"asr": {"vad": VAD, "min_utterance_s": 0.3}, **overrides}
    return running_gateway(cfg, backend=FakeBackend(ms_per_char=20.0))


AUTH = {"enabled": True, "secret": "console-test-secret-0123"}


async def connect(page, url: str, token: str = "") -> None:
    await page.goto(url + "/console")
    await page.fill("#device-token", token)
    await page.click("#talk-connect")
    await page.wait_for_function(
        "document.getElementById('talk-state').textContent === 'idle'", timeout=10000
    )


async def test_spoken_turn_in_auto_mode_plays_the_decoded_reply(tmp_path, monkeypatch):
    asr = FixedASR()
    monkeypatch.setattr("gateway.services.create_asr", lambda *a, **kw: asr)
    # device auth on: the page uses the device token that OTA hands out (ota_open admits any Device-Id)
    async with (
        gateway(server={"auth": {**AUTH, "ota_open": True}}) as gw,
        chromium_page(mic_wav(tmp_path)) as page,
    ):
        await connect(page, gw.url)
        await page.select_option("#talk-mode", "auto")
        await page.click("#talk-listen")
        # the status panel sees the session while the turn runs
        await page.wait_for_function(
            "document.getElementById('status-sessions').textContent.startsWith('1')", timeout=10000
        )
        await page.wait_for_function(
            "(() => { const t = window.xzConsole.talk; return t.stt.length > 0 && t.stats.framesDecoded > 10"
            " && t.sentences.length > 0; })()",
            timeout=20000,
        )
        talk = await page.evaluate(
            "(() => { const t = window.xzConsole.talk;"
            " return {stt: t.stt, sentences: t.sentences, stats: t.stats}; })()"
        )
        await page.wait_for_function(
            "window.xzConsole.status && window.xzConsole.status.first_audio.count > 0", timeout=15000
        )
        await screenshot(page, "console-talk.png")
        log = await page.inner_text("#talk-log")
        errors = page.errors
    assert ", token)" in log  # OTA gave this Device-Id a token and the socket took it
    assert talk["stt"][0] == QUERY
    assert any(QUERY in s for s in talk["sentences"])  # the echo LLM repeats it
    assert talk["stats"]["framesSent"] > 10  # the page streamed Opus frames of the microphone
    assert talk["stats"]["samplesDecoded"] >= talk["stats"]["framesDecoded"] * 960  # 60 ms at >= 16 kHz
    assert asr.calls >= 1
    assert errors == []


async def test_typed_turn_gets_a_spoken_reply_with_an_operator_token():
    async with (
        gateway(server={"auth": {**AUTH, "tokens": ["operator-token-1"]}}) as gw,
        chromium_page() as page,
    ):
        await page.goto(gw.url + "/console")
        await page.click("#talk-connect")  # not admitted: OTA gives no token, the socket refuses
        await page.wait_for_function(
            "document.getElementById('talk-log').textContent.includes('connect:')", timeout=10000
        )
        refused = await page.inner_text("#talk-log")
        await connect(page, gw.url, token="operator-token-1")
        await page.fill("#talk-text", "Tell me a joke")
        await page.click("#talk-send")
        await page.wait_for_function(
            "(() => { const t = window.xzConsole.talk;"
            " return t.sentences.some(s => s.includes('Tell me a joke')) && t.stats.framesDecoded > 5; })()",
            timeout=15000,
        )
        log = await page.inner_text("#talk-log")
        errors = page.errors
    assert "WebSocket failed" in refused
    assert "Tell me a joke" in log
    assert errors == []


async def test_voice_panel_streams_speech_behind_an_api_key():
    async with gateway(api={"api_keys": ["console-key"]}) as gw, chromium_page() as page:
        await page.goto(gw.url + "/console")  # the page itself needs no key
        await page.wait_for_function(
            "document.getElementById('status-error').textContent.includes('API key')", timeout=10000
        )
        await page.fill("#api-key", "console-key")
        await page.click("#key-form button")
        await page.wait_for_function("document.getElementById('voice-select').options.length > 0")
        await page.fill("#voice-text", "Hello from the voice panel.")
        await page.click("#voice-speak")
        await page.wait_for_function(
            "window.xzConsole.voice.done || window.xzConsole.voice.error", timeout=15000
        )
        voice = await page.evaluate("window.xzConsole.voice")
        shown = await page.inner_text("#voice-first-audio")
        await page.wait_for_function(
            "document.getElementById('status-error').textContent === ''", timeout=5000
        )
        await screenshot(page, "console-voices.png")
    assert voice["error"] is None
    assert voice["firstAudioMs"] > 0 and shown.endswith("ms")
    # 27 characters at 20 ms each, 24 kHz s16le: at least half a second of audio arrived
    assert voice["bytes"] >= 24000


async def test_voice_panel_adds_and_deletes_a_voice(tmp_path):
    prompt = tmp_path / "prompt.wav"
    prompt.write_bytes(prompt_wav(2.0))
    cfg = {"asr": {"backend": "none"}, "tts": {"voices_dir": str(tmp_path / "voices")}}
    async with running_gateway(cfg, backend=CloningFakeBackend()) as gw, chromium_page() as page:
        page.on("dialog", lambda dialog: dialog.accept())  # the "Delete voice ...?" confirm
        await page.goto(gw.url + "/console")
        await page.click("#voices summary")
        await page.fill("#voice-name", "alice")
        await page.fill("#voice-prompt-text", "A test prompt.")
        await page.set_input_files("#voice-file", str(prompt))
        await page.click("#voice-add-form button[type=submit]")
        await page.wait_for_function(
            "[...document.getElementById('voice-select').options].some(o => o.value === 'alice')",
            timeout=10000,
        )
        added = await page.inner_text("#voice-add-state")
        await page.select_option("#voice-select", "alice")
        await page.click("#voice-delete")
        await page.wait_for_function(
            "![...document.getElementById('voice-select').options].some(o => o.value === 'alice')",
            timeout=10000,
        )
        errors = page.errors
    assert "added alice" in added
    assert errors == []
