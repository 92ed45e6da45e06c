"""One session's microphone: Opus -> 16 kHz PCM -> VAD -> utterances.

Two ways to listen, chosen at each `listen start`:

* endpointing (auto, realtime): the VAD decides where utterances start and end.
  `UtteranceStarted` comes once speech has lasted `min_speech_ms` (a barge-in
  may stop the reply then); `UtteranceEnded` after `min_silence_ms` of silence,
  with the utterance's audio from `pre_roll_ms` before the detected start to
  the point of decision. Only that much audio is kept in memory.
* buffering (manual): everything since `listen start` is kept (bounded by
  `max_utterance_s`) until `take()` at `listen stop`.

Times in events are seconds of stream audio since the last `reset()`.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from audio_codecs.opus import OpusDecodeError, OpusDecoder
from gateway.asr.vad import SAMPLE_RATE, SileroVAD, SpeechEnd, SpeechStart, VoiceActivityDetector
from gateway.config import VADConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class UtteranceStarted:
    start_s: float


@dataclass(frozen=True, slots=True)
class UtteranceEnded:
    pcm: np.ndarray  # int16, pre-roll included
    start_s: float
    end_s: float

    @property
    def speech_s(self) -> float:
        return self.end_s - self.start_s


ListenEvent = UtteranceStarted | UtteranceEnded


class _Audio:
    """Consecutive chunks of the stream with their absolute sample positions."""

    def __init__(self) -> None:
        self.chunks: deque[np.ndarray] = deque()
        self.start = 0  # stream position of the first kept sample
        self.end = 0  # stream position after the last sample

    def clear(self, position: int = 0) -> None:
        self.chunks.clear()
        self.start = self.end = position

    def append(self, pcm: np.ndarray) -> None:
        self.chunks.append(pcm)
        self.end += pcm.size

    def drop_before(self, position: int) -> int:
        """Forgets whole chunks that end at or before `position`; returns samples dropped."""
        dropped = 0
        while self.chunks and self.start + self.chunks[0].size <= position:
            size = self.chunks.popleft().size
            self.start += size
            dropped += size
        return dropped

    def slice(self, begin: int, end: int | None = None) -> np.ndarray:
        if not self.chunks:
            return np.zeros(0, np.int16)
        pcm = np.concatenate(list(self.chunks))
        begin = max(begin - self.start, 0)
        stop = pcm.size if end is None else max(end - self.start, begin)
        return pcm[begin:stop]


class Listener:
    def __init__(
        self,
        cfg: VADConfig,
        *,
        max_utterance_s: float = 60.0,
        vad: SileroVAD | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cfg = cfg
        self._decoder = OpusDecoder(SAMPLE_RATE)
        self._vad = VoiceActivityDetector(cfg, vad)
        self._clock = clock
        self._audio = _Audio()
        self._pre_roll = cfg.pre_roll_ms * SAMPLE_RATE // 1000
        self._max_samples = int(max_utterance_s * SAMPLE_RATE)
        self._muted_until = 0.0
        # echo cancellation of decoded uplink audio (pcm, v2 timestamp) -> pcm; None: none
        self.clean: Callable[[np.ndarray, int], np.ndarray] | None = None
        self.endpointing = True
        self.dropped_samples = 0
        self.bad_packets = 0
        self.concealed_packets = 0  # lost uplink packets (UDP) filled by the decoder's concealment

    # ---- control -----------------------------------------------------------------

    def reset(self, *, endpointing: bool | None = None) -> None:
        """A new `listen start`: forget buffered audio and VAD state (a mute goes on)."""
        if endpointing is not None:
            self.endpointing = endpointing
        self._vad.reset()
        self._audio.clear()

    def mute(self, seconds: float) -> None:
        """Drop microphone audio for `seconds` of wall time (the wake word's tail)."""
        self._muted_until = max(self._muted_until, self._clock() + seconds)
        self.reset()

    @property
    def muted(self) -> bool:
        return self._clock() < self._muted_until

    @property
    def position_s(self) -> float:
        return self._audio.end / SAMPLE_RATE

    # ---- audio -------------------------------------------------------------------

    def push(self, packet: bytes, *, timestamp_ms: int = 0) -> list[ListenEvent]:
        """Decode one uplink packet; returns the utterance boundaries it completes."""
        if not packet:
            return []
        try:
            pcm = self._decoder.decode(packet)  # always decoded: the decoder keeps state
        except OpusDecodeError as exc:
            self.bad_packets += 1
            log.debug("dropping undecodable uplink packet (%d bytes): %s", len(packet), exc)
            return []
        if pcm.size and self.clean is not None:
            try:
                pcm = self.clean(pcm, timestamp_ms)  # also while muted: the canceller keeps adapting
            except Exception:  # the canceller must never end the session: the frame goes on uncleaned
                log.exception("echo cancellation failed on a %d-sample frame", pcm.size)
        if not pcm.size or self.muted:
            return []
        return self.push_pcm(pcm)

    def conceal(self, packets: int, frame_ms: int = 60) -> list[ListenEvent]:
        """Packets lost in transit (a UDP sequence gap): the decoder's concealment fills their time, so
        the VAD's clock and the utterance keep their length. Returns the boundaries it completes."""
        events: list[ListenEvent] = []
        for _ in range(packets):
            try:
                pcm = self._decoder.conceal(SAMPLE_RATE * frame_ms // 1000)
            except (OpusDecodeError, ValueError) as exc:
                log.debug("no concealment for a lost uplink packet: %s", exc)
                return events
            self.concealed_packets += 1
            if pcm.size and self.clean is not None:
                try:
                    pcm = self.clean(pcm, 0)
                except Exception:
                    log.exception("echo cancellation failed on a concealed frame")
            if pcm.size and not self.muted:
                events += self.push_pcm(pcm)
        return events

    def push_pcm(self, pcm: np.ndarray) -> list[ListenEvent]:
        self._audio.append(pcm)
        if not self.endpointing:
            over = self._audio.end - self._max_samples
            if over > self._audio.start:
                self.dropped_samples += self._audio.drop_before(over)
            return []
        events: list[ListenEvent] = []
        for boundary in self._vad.feed(pcm):
            events.append(self._event(boundary))
        endpointer = self._vad.endpointer
        if endpointer.onset is not None and endpointer.position - endpointer.onset >= self._max_samples:
            end = endpointer.force_end()  # a long utterance is cut here; nothing is lost
            if end is not None:
                events.append(self._event(end))
        onset = endpointer.onset
        keep_from = (onset if onset is not None else self._audio.end) - self._pre_roll
        self._audio.drop_before(keep_from)
        return events

    def take(self) -> np.ndarray:
        """Everything buffered (manual mode), or the utterance in progress; empties the buffer."""
        pcm = np.zeros(0, np.int16)
        if not self.endpointing:
            pcm = self._audio.slice(self._audio.start)
        elif self._vad.endpointer.confirmed and self._vad.endpointer.onset is not None:
            pcm = self._audio.slice(self._vad.endpointer.onset - self._pre_roll)
        self.reset()
        return pcm

    def _event(self, boundary: SpeechStart | SpeechEnd) -> ListenEvent:
        if isinstance(boundary, SpeechStart):
            return UtteranceStarted(boundary.start / SAMPLE_RATE)
        pcm = self._audio.slice(boundary.start - self._pre_roll)
        return UtteranceEnded(pcm, boundary.start / SAMPLE_RATE, boundary.end / SAMPLE_RATE)
