"""A session's listening (protocol §9 b-d): listen modes, wake-word `detect`, and recognition.

`ListenHandling` is a part of `Session` (gateway/device/session.py): it turns `listen` messages and the
listener's speech events into turns, through the session's `_start_turn`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import unicodedata
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

import numpy as np

from gateway.asr import ASRError, ASRNotConfigured
from gateway.device.listener import ListenEvent, UtteranceEnded, UtteranceStarted
from gateway.xiaozhi import Listen, ListenMode, ListenState

if TYPE_CHECKING:
    from gateway.aec import EchoCanceller
    from gateway.device.idle import IdleClock
    from gateway.device.listener import Listener
    from gateway.services import Services
    from gateway.speech.turns import Turns

log = logging.getLogger(__name__)

TaskFactory = Callable[[], Coroutine[Any, Any, None]]


def _bare(text: str) -> str:
    """Text without punctuation, symbols and spaces, for wake-word comparison."""
    return "".join(ch for ch in text if unicodedata.category(ch)[0] in "LN")


class ListenHandling:
    session_id: str
    services: Services
    listener: Listener
    mode: ListenMode
    listening: bool
    echo: EchoCanceller | None
    turns: Turns
    idle: IdleClock
    _turn: asyncio.Task[None] | None
    _recognition: asyncio.Task[None] | None
    _recognising: np.ndarray
    _tg: asyncio.TaskGroup | None
    _closing: bool

    if TYPE_CHECKING:  # the session's own, used here

        async def _start_turn(self, make_turn: TaskFactory) -> None: ...
        async def _cancel_turn(self, *, aborted: bool = False) -> bool: ...
        async def _guard(self, make: TaskFactory, what: str) -> None: ...
        async def _query_turn(self, text: str) -> None: ...
        async def _exit_turn(self, text: str) -> None: ...

    async def _on_listen(self, listen: Listen) -> None:
        if listen.state == ListenState.START:
            if listen.mode is not None:
                self.mode = listen.mode
            self.listener.reset(endpointing=self.mode != ListenMode.MANUAL)
            self.listening = True
        elif listen.state == ListenState.STOP:
            self.listening = False
            pcm = self.listener.take()
            if pcm.size >= self.services.config.asr.min_utterance_s * 16000:
                self.idle.heard_voice()
                self._recognise(pcm)
        elif listen.state == ListenState.DETECT:
            await self._on_detect((listen.text or "").strip())

    async def _on_detect(self, text: str) -> None:
        # The wake word's own audio (burst before `detect`, tail after it) is no query.
        self._cancel_recognition()
        self.listener.mute(self.services.config.asr.vad.detect_mute_s)
        if not text:
            return
        self.idle.heard_voice()
        cfg = self.services.config.session
        bare = _bare(text)
        spoken = self.turns.spoken
        if bare and bare in {_bare(w) for w in cfg.wake_words}:
            if cfg.enable_greeting:  # the device's agent's greeting
                await self._start_turn(self.turns.greeting)
            else:
                await self._start_turn(functools.partial(spoken, text, [], kind="greeting"))
            return
        if bare and bare in {_bare(w) for w in cfg.exit_commands}:
            await self._start_turn(functools.partial(self._exit_turn, text))
            return
        await self._start_turn(functools.partial(self._query_turn, text))

    async def _on_speech(self, event: ListenEvent) -> None:
        if isinstance(event, UtteranceStarted):
            self.idle.heard_voice()
            # only with our echo cancelled can speech heard during a reply be the user's
            barge_in = self.mode == ListenMode.REALTIME and self.echo is not None
            if barge_in and self._turn is not None and not self._turn.done():
                await self._cancel_turn(aborted=True)  # `tts stop` as soon as speech is heard
        elif isinstance(event, UtteranceEnded):
            self.idle.heard_voice()
            if event.speech_s >= self.services.config.asr.min_utterance_s:
                self._recognise(event.pcm)

    def _recognise(self, pcm: np.ndarray) -> None:
        """Recognises an utterance in its own task; its text then starts the reply turn.

        The playing reply goes on until then (without AEC a reply is only cut by
        recognised speech). An utterance that ends while the previous one is still
        being recognised continues it: both are recognised together.
        """
        if self._tg is None or self._closing:
            return
        if self._recognition is not None and not self._recognition.done():
            self._recognition.cancel()
            pcm = np.concatenate([self._recognising, pcm])
        self._recognising = pcm
        self._recognition = self._tg.create_task(
            self._guard(functools.partial(self._recognition_task, pcm), "asr")
        )
        self._recognition.add_done_callback(self.idle.became_quiet)

    def _cancel_recognition(self) -> None:
        if self._recognition is not None:
            self._recognition.cancel()
        self._recognition = None

    async def _recognition_task(self, pcm: np.ndarray) -> None:
        try:
            text = (await self.services.asr.transcribe(pcm)).strip()
        except ASRNotConfigured:
            reply = self.services.config.asr.not_configured_reply
            await self._start_turn(functools.partial(self.turns.spoken, None, [reply], kind="notice"))
            return
        except ASRError as exc:
            log.warning("session %s: ASR failed: %s", self.session_id, exc)
            return
        if text:
            await self._start_turn(functools.partial(self._query_turn, text))
