"""The bodies of a session's spoken turns: fixed sentences, and LLM replies.

A turn sends `tts start`, speaks, and sends the one matching `tts stop` in its
`finally`, whether it ends normally or is cancelled (abort, a new query, the
end of the connection). The session decides when turns start and stop;
this module only says what a turn sends.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from audio_codecs.opus import OpusEncoder
from gateway.llm.conversation import Conversation
from gateway.pacer import Pacer
from gateway.reply import Reply, fixed_sentences
from gateway.segmenter import SentenceSegmenter
from gateway.services import Services
from gateway.speaker import Speaker
from gateway.xiaozhi import Stt, TtsStart, TtsStop


class Turns:
    def __init__(
        self,
        *,
        services: Services,
        send: Callable[[object], Awaitable[None]],
        encoder: OpusEncoder,
        sample_rate: int,
        conversation: Conversation,
        features: Callable[[], dict[str, Any]],
        remember: Callable[[str, str], None] | None = None,
    ) -> None:
        self._services = services
        self._send = send
        self._encoder = encoder
        self._sample_rate = sample_rate
        self._conversation = conversation
        self._features = features
        self._remember = remember  # saves an exchange to the device's memory (never blocks)

    async def speak(self, sentences: AsyncIterator[str], t_query: float) -> None:
        """Sentences -> paced audio, then wait until `tts stop` may go out."""
        cfg = self._services.config.audio
        metrics = self._services.metrics
        pacer = Pacer(
            frame_s=cfg.frame_ms / 1000,
            lead_frames=cfg.prebuffer_frames,
            not_before=time.monotonic() + cfg.start_gap_ms / 1000,
        )
        speaker = Speaker(
            engine=self._services.engine,
            encoder=self._encoder,
            send=self._send,
            voice=self._services.config.tts.voice,
            sample_rate=self._sample_rate,
            pacer=pacer,
            on_frame=metrics.frames_sent.inc,
            on_sentence_error=metrics.tts_errors.inc,
        )
        result = await speaker.speak(sentences)
        if result.first_frame_at is not None:
            metrics.observe_first_audio(result.first_frame_at - t_query)
        if result.underruns:
            metrics.underruns.inc(result.underruns)
        delay = pacer.stop_time(cfg.stop_margin_ms / 1000) - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)

    async def spoken(self, stt_text: str | None, texts: list[str], *, kind: str) -> None:
        """A turn with fixed sentences (greeting, notices)."""
        self._services.metrics.turns_total.labels(kind).inc()
        t_query = time.monotonic()
        if stt_text is not None:
            await self._send(Stt(text=stt_text))
        try:
            await self._send(TtsStart())  # inside: a cancel while it is being sent still sends the stop
            await self.speak(fixed_sentences(texts), t_query)
        finally:
            await self._send(TtsStop())

    async def query(self, text: str) -> None:
        """The user said or typed `text`: `stt`, then the LLM's streamed answer."""
        self._services.metrics.turns_total.labels("query").inc()
        t_query = time.monotonic()
        cfg = self._services.config
        await self._send(Stt(text=text))
        reply = Reply(
            llm=self._services.llm,
            messages=self._conversation.messages_for(text),
            segmenter=SentenceSegmenter(
                first_segment_at_comma=cfg.segmenter.first_segment_at_comma,
                max_chars=cfg.segmenter.max_chars,
            ),
            send=self._send,
            apology=cfg.llm.apology,
            send_emotion=self._features().get("emoji", True) is not False,
            on_error=self._services.metrics.llm_errors.inc,
        )
        try:
            await self._send(TtsStart())
            await self.speak(reply.sentences(), t_query)
        finally:
            if reply.text.strip():
                self._conversation.add_turn(text, reply.text)
                if self._remember is not None:  # as far as it got when aborted, like the history
                    self._remember(text, reply.text)
            await self._send(TtsStop())
