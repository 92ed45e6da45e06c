"""A synthetic acoustic echo path for the server-AEC tests and benchmark.

`EchoPath` is what a single-microphone device's loudspeaker does to our reply
on its way into the microphone: a delay, a gain, a short room impulse response
(direct sound, exponentially decaying reflections), light clipping. It works
in 16 kHz streaming frames, keeping the tail of the loudspeaker signal that
the next frame's convolution needs (scipy.signal.lfilter's filter state).
`EchoDevice` drives a `DeviceSimulator` as such a device: it plays the
downlink as the device would (frames back to back from a queue) and sends, at
real time, what its microphone hears: that echo, optional near-end speech and
noise, with v2 timestamps of the last played packet when asked.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import numpy as np
from scipy.signal import lfilter

from audio_codecs.opus import OpusEncoder
from gateway.aec.reference import EchoReference  # used here only as the loudspeaker's queue
from gateway.xiaozhi import AudioIn, AudioOut

RATE = 16000
FRAME = 960  # 60 ms uplink frames


def room_impulse_response(length_ms: float = 30.0, rt60_ms: float = 120.0, seed: int = 0) -> np.ndarray:
    """Direct sound plus exponentially decaying random reflections, normalised to unit peak."""
    rng = np.random.default_rng(seed)
    n = int(length_ms * RATE / 1000)
    t = np.arange(n) / RATE
    decay = np.exp(-6.9 * t / (rt60_ms / 1000))  # -60 dB at rt60
    rir = rng.standard_normal(n) * decay * 0.3
    rir[0] = 1.0
    return rir / np.max(np.abs(rir))


def reverberant_impulse_response(
    length_ms: float = 400.0, rt60_ms: float = 500.0, drr_db: float = 5.0, seed: int = 0
) -> np.ndarray:
    """A loudspeaker and microphone in a reverberant room: the direct sound, then a diffuse tail
    (exponentially decaying noise, -60 dB at `rt60_ms`) `drr_db` below it in energy (the
    direct-to-reverberant ratio), the whole at unit energy: an EchoPath's gain is then the echo's
    energy against the reference's. Most of the tail lies past any linear filter's span here
    (SpeexDSP's 64 ms, AEC3's ~50): AEC3's suppressor has to take it."""
    rng = np.random.default_rng(seed)
    n = int(length_ms * RATE / 1000)
    t = np.arange(n) / RATE
    tail = rng.standard_normal(n) * np.exp(-6.9 * t / (rt60_ms / 1000))
    tail[0] = 0.0
    tail *= np.sqrt(10 ** (-drr_db / 10) / np.sum(tail**2))
    rir = tail
    rir[0] = 1.0
    return rir / np.sqrt(np.sum(rir**2))


@dataclass
class EchoPath:
    delay_ms: float = 120.0
    gain_db: float = -10.0
    rir: np.ndarray = field(default_factory=room_impulse_response)
    clip: float = 0.8  # full scale fraction where the loudspeaker's amplifier clips (light: peaks only)
    _state: np.ndarray | None = None
    _pending: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))

    def __post_init__(self) -> None:
        self._pending = np.zeros(int(self.delay_ms * RATE / 1000), np.float64)
        self._state = np.zeros(self.rir.size - 1)

    def feed(self, loudspeaker: np.ndarray) -> np.ndarray:
        """The microphone's echo for the next `loudspeaker.size` samples (int16 in, float out)."""
        x = loudspeaker.astype(np.float64)
        limit = self.clip * 32767
        x = np.clip(x, -limit, limit)
        y, self._state = lfilter(self.rir, [1.0], x, zi=self._state)
        y = np.concatenate([self._pending, y * 10 ** (self.gain_db / 20)])
        out, self._pending = y[: x.size], y[x.size :]
        return out


class EchoDevice:
    """The microphone side of a simulated single-mic device (see module doc)."""

    def __init__(
        self, sim, path: EchoPath, *, timestamps: bool = True, noise_dbfs: float | None = -60.0, seed: int = 0
    ) -> None:
        self.sim = sim
        self.path = path
        self.timestamps = timestamps
        self.noise = None if noise_dbfs is None else 32768 * 10 ** (noise_dbfs / 20)
        self._rng = np.random.default_rng(seed)
        self._origin = time.monotonic()
        self.speaker = EchoReference(keep_s=6.0)
        self._played: list[tuple[float, int]] = []  # (play start ms, timestamp) of downlink packets
        self._encoder = OpusEncoder(RATE, 60)
        sim.on_audio = self._on_audio

    def _now_ms(self) -> float:
        return (time.monotonic() - self._origin) * 1000

    def _on_audio(self, event: AudioOut) -> None:
        start = self.speaker.add_packet(event.opus, self._now_ms())
        self._played.append((start, event.timestamp_ms))
        del self._played[:-64]

    def _stamp(self, until_ms: float) -> int:
        """The timestamp of the packet that started playing last before `until_ms` (0: none lately)."""
        for start, stamp in reversed(self._played):
            if start <= until_ms:
                return stamp if until_ms - start < 120 else 0
        return 0

    async def talk(self, seconds: float, near: np.ndarray | None = None, near_at_s: float = 0.0) -> float:
        """Sends `seconds` of microphone audio at real time; returns the monotonic start time.

        The microphone hears the loudspeaker through the echo path, `near` (int16 speech)
        from `near_at_s` on, and noise.
        """
        frames = int(seconds * RATE) // FRAME
        t0 = time.monotonic()
        start_ms = self._now_ms()
        for k in range(frames):
            due = t0 + (k + 1) * FRAME / RATE  # a frame leaves once it has been captured
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            frame_ms = start_ms + k * FRAME * 1000 / RATE
            mic = self.path.feed(self.speaker.read(frame_ms, FRAME))
            if near is not None:
                at = k * FRAME - int(near_at_s * RATE)
                if at + FRAME > 0 and at < near.size:
                    part = near[max(at, 0) : at + FRAME].astype(np.float64)
                    lo = max(-at, 0)
                    mic[lo : lo + part.size] += part
            if self.noise is not None:
                mic += self._rng.standard_normal(FRAME) * self.noise
            pcm = np.clip(mic, -32768, 32767).astype(np.int16)
            stamp = self._stamp(frame_ms + FRAME * 1000 / RATE) if self.timestamps else 0
            for packet in self._encoder.encode(pcm):
                await self.sim.send(AudioIn(opus=packet, timestamp_ms=stamp))
        return t0
