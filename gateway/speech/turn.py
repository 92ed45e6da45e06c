"""One spoken turn as an object, built from plain parts: an engine, an LLM, `send`, a `TurnConfig`.

A `Turn` owns what one reply needs and nothing a session shares: its Opus encoder, its pacer
and its sentence segmenter. It sends `tts start`, speaks (fixed sentences or the LLM's answer,
whose emotion it sends before the first sentence), and sends the one matching `tts stop` in its
`finally`, whether it ends normally or is cancelled (abort, a new query, the end of the
connection). The session decides when turns start and stop (gateway/speech/turns.py builds them).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from audio_codecs.opus import OpusEncoder
from gateway.config import Config
from gateway.llm.base import ChatLLM
from gateway.speech.pacer import Pacer
from gateway.speech.phrases import Phrases
from gateway.speech.reply import Emotion, Reply, ReplyEvent, fixed_sentences
from gateway.speech.segmenter import SentenceSegmenter
from gateway.speech.speaker import Speaker, SpeakResult
from gateway.speech.voice_choice import TurnVoice, VoiceChoice
from gateway.tools.runner import ToolLoopSettings
from gateway.tools.toolset import ToolSet
from gateway.xiaozhi import Event, LlmEmotion, Stt, TtsStart, TtsStop
from tts_engine import SpeechEngine

Send = Callable[[Event], Awaitable[None]]
# this turn's tools, or how to gather them once the `stt` echo went out (the device's list may be slow)
Tools = ToolSet | Callable[[], Awaitable[ToolSet | None]] | None


@dataclass(frozen=True)
class TurnConfig:
    """Everything a turn reads from the configuration (`turn_config` builds it).

    `sample_rate` is the device downlink's output rate (`audio.output_sample_rate`, one of the engine's
    `OUTPUT_RATES` that Opus takes): the one place a session's turns, its hello and its stored phrases
    read it from. `voice` is the configured voice a session starts with (its `VoiceChoice`)."""

    sample_rate: int = 16000
    frame_ms: int = 60
    opus_bitrate: int = 24000
    opus_complexity: int = 5
    prebuffer_frames: int = 5
    start_gap_ms: int = 120
    stop_margin_ms: int = 420
    voice: str | None = None
    apology: str = "抱歉，我现在有点问题，请稍后再试。"
    first_segment_at_comma: bool = True
    max_segment_chars: int = 120
    tools: ToolLoopSettings = field(default_factory=ToolLoopSettings)


def turn_config(config: Config) -> TurnConfig:
    audio, llm = config.audio, config.llm
    return TurnConfig(
        sample_rate=audio.output_sample_rate,
        frame_ms=audio.frame_ms,
        opus_bitrate=audio.opus_bitrate,
        opus_complexity=audio.opus_complexity,
        prebuffer_frames=audio.prebuffer_frames,
        start_gap_ms=audio.start_gap_ms,
        stop_margin_ms=audio.stop_margin_ms,
        voice=config.tts.voice,
        apology=llm.apology,
        first_segment_at_comma=config.segmenter.first_segment_at_comma,
        max_segment_chars=config.segmenter.max_chars,
        tools=ToolLoopSettings(
            max_rounds=llm.max_tool_rounds,
            call_timeout_s=llm.tool_timeout_s,
            filler_after_s=llm.tool_filler_after_s,
            filler=llm.tool_filler,
        ),
    )


def _nothing(*_args: Any) -> None:
    return None


@dataclass(frozen=True)
class TurnRecorder:
    """What a turn reports, as callbacks (the session wires them to its metrics)."""

    frame_sent: Callable[[], None] = _nothing
    sentence_failed: Callable[[], None] = _nothing
    llm_failed: Callable[[], None] = _nothing
    first_audio: Callable[[float], None] = _nothing  # seconds from the turn's start to its first frame
    underruns: Callable[[int], None] = _nothing
    tool_call: Callable[[str, str, float], None] = _nothing  # (source, ok|failed|timeout, seconds)
    # once a reply's audio is over, also when it was cut short: (characters spoken, audio seconds sent,
    # first audio seconds or None, whether a sentence failed): the device's usage (gateway/service/usage.py)
    spoke: Callable[[int, float, float | None, bool], None] = _nothing


class Turn:
    """One reply: `say` fixed sentences or `answer` a query; then `result`, `first_audio_s`, `answer_text`."""

    def __init__(
        self,
        *,
        engine: SpeechEngine,
        llm: ChatLLM,
        send: Send,
        config: TurnConfig,
        voice: TurnVoice | VoiceChoice | str | None = None,  # a session's voice; a name or None: fixed
        tools: Tools = None,
        emotion: bool = True,  # send the reply's emotion (`features.emoji: false` turns it off)
        recorder: TurnRecorder | None = None,
        started: float | None = None,  # when the user's query arrived (monotonic): first audio counts from it
        phrases: Phrases | None = None,  # the fixed phrases' stored audio (gateway/speech/phrases.py)
        expressive: dict[str, str] | None = None,  # emotion -> instruct text for this reply (an agent's)
    ) -> None:
        self._engine = engine
        self._llm = llm
        self._send = send
        self._config = config
        if isinstance(voice, TurnVoice):
            self._voice = voice
        else:
            self._voice = TurnVoice(
                voice if isinstance(voice, VoiceChoice) else VoiceChoice(voice or config.voice)
            )
        self._expressive = expressive
        self._tools = tools
        self._emotion = emotion
        self._recorder = recorder or TurnRecorder()
        self._phrases = phrases
        self.started = time.monotonic() if started is None else started
        self.encoder = OpusEncoder(
            config.sample_rate,
            config.frame_ms,
            bitrate=config.opus_bitrate,
            complexity=config.opus_complexity,
        )
        self.pacer: Pacer | None = None  # made when speaking starts: the start gap counts from `tts start`
        self.segmenter = SentenceSegmenter(
            first_segment_at_comma=config.first_segment_at_comma,
            max_chars=config.max_segment_chars,
        )
        self.reply: Reply | None = None
        self.result: SpeakResult | None = None

    @property
    def first_audio_s(self) -> float | None:
        """Seconds from the turn's start to its first audio frame (None: no audio went out)."""
        if self.result is None or self.result.first_frame_at is None:
            return None
        return self.result.first_frame_at - self.started

    @property
    def underruns(self) -> int:
        return self.result.underruns if self.result is not None else 0

    @property
    def answer_text(self) -> str:
        """The LLM's answer as far as it got (also after an abort); empty for fixed sentences."""
        return self.reply.text if self.reply is not None else ""

    async def say(self, texts: list[str], *, stt: str | None = None) -> None:
        """Fixed sentences (greeting, notices), after an `stt` echo of what the user said if given."""
        if stt is not None:
            await self._send(Stt(text=stt))
        try:
            await self._send(TtsStart())  # inside: a cancel while it is being sent still sends the stop
            await self._speak(fixed_sentences(texts))
        finally:
            await self._send(TtsStop())

    async def answer(self, query: str, messages: list[dict[str, str]]) -> None:
        """`stt`, then the LLM's streamed answer to `messages` (the history ending in `query`)."""
        await self._send(Stt(text=query))
        tools = await self._tools() if callable(self._tools) else self._tools
        self.reply = Reply(
            llm=self._llm,
            messages=messages,
            segmenter=self.segmenter,
            apology=self._config.apology,
            emotion=self._emotion,
            on_error=self._recorder.llm_failed,
            tools=tools,
            tool_settings=self._config.tools,
            on_tool_call=self._recorder.tool_call,
        )
        events = self.reply.events()
        sentences = self._sentences(events)
        try:
            await self._send(TtsStart())
            await self._speak(sentences)
        finally:
            await sentences.aclose()
            await events.aclose()  # cancels a tool call still running (abort)
            await self._send(TtsStop())

    async def _sentences(self, events: AsyncIterator[ReplyEvent]) -> AsyncGenerator[str, None]:
        """The reply's sentences; its emotion goes to the device as it comes (before the first one)."""
        async for event in events:
            if isinstance(event, Emotion):
                await self._send(LlmEmotion(emotion=event.emotion, text=event.emoji))
                if self._expressive and event.emotion in self._expressive:  # the voice matches the face
                    self._voice.instruct = self._expressive[event.emotion]
            else:
                yield event

    async def _speak(self, sentences: AsyncIterator[str]) -> None:
        """Sentences -> paced audio, then wait until `tts stop` may go out."""
        cfg = self._config
        self.pacer = pacer = Pacer(
            frame_s=cfg.frame_ms / 1000,
            lead_frames=cfg.prebuffer_frames,
            not_before=time.monotonic() + cfg.start_gap_ms / 1000,
        )
        speaker = Speaker(
            engine=self._engine,
            encoder=self.encoder,
            send=self._send,
            voice=self._voice,
            pacer=pacer,
            on_frame=self._recorder.frame_sent,
            on_sentence_error=self._recorder.sentence_failed,
            apology=cfg.apology,  # ends the reply when the engine fails a sentence
            phrases=self._phrases,
        )
        self.result = result = speaker.result  # as far as it got, also when cancelled
        try:
            await speaker.speak(sentences)
        finally:
            if result.frames or result.failed_sentences:
                self._recorder.spoke(sum(len(s) for s in result.spoken), result.frames * cfg.frame_ms / 1000,
                                     self.first_audio_s, bool(result.failed_sentences))  # fmt: skip
        if (first := self.first_audio_s) is not None:
            self._recorder.first_audio(first)
        if self.result.underruns:
            self._recorder.underruns(self.result.underruns)
        delay = pacer.stop_time(cfg.stop_margin_ms / 1000) - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
