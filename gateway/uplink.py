"""Uplink audio: Opus packets -> 16 kHz PCM, buffered per utterance (bounded)."""

from __future__ import annotations

import logging
from collections import deque

import numpy as np

from audio_codecs.opus import OpusDecodeError, OpusDecoder

log = logging.getLogger(__name__)

UPLINK_RATE = 16000


class UtteranceBuffer:
    """Decodes packets in arrival order and keeps at most `max_s` seconds."""

    def __init__(self, *, max_s: float = 60.0) -> None:
        self._decoder = OpusDecoder(UPLINK_RATE)
        self._chunks: deque[np.ndarray] = deque()
        self._samples = 0
        self._max_samples = int(max_s * UPLINK_RATE)
        self.dropped_samples = 0
        self.bad_packets = 0

    def push(self, packet: bytes) -> np.ndarray | None:
        """Decode one packet and buffer it; returns the PCM (None for a dropped packet)."""
        if not packet:
            return None
        try:
            pcm = self._decoder.decode(packet)
        except OpusDecodeError as exc:
            self.bad_packets += 1
            log.debug("dropping undecodable uplink packet (%d bytes): %s", len(packet), exc)
            return None
        if pcm.size:
            self._chunks.append(pcm)
            self._samples += pcm.size
            while self._samples > self._max_samples and self._chunks:
                old = self._chunks.popleft()
                self._samples -= old.size
                self.dropped_samples += old.size
        return pcm

    @property
    def duration_s(self) -> float:
        return self._samples / UPLINK_RATE

    def take(self) -> np.ndarray:
        """The buffered utterance (int16), emptying the buffer."""
        pcm = np.concatenate(list(self._chunks)) if self._chunks else np.zeros(0, np.int16)
        self.reset()
        return pcm

    def reset(self) -> None:
        self._chunks.clear()
        self._samples = 0
