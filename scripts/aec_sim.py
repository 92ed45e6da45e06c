"""Offline server-AEC simulation shared by tests/test_aec.py and scripts/bench_aec.py.

The server's side is the real `EchoCanceller` fed as the session feeds it
(downlink packets into the reference when sent, uplink frames with their
arrival times and v2 stamps); the device plays each packet `play_lag_ms` after
the server's model says, and its microphone hears an `EchoPath` of that plus
optional near-end speech. Time is simulated: no sleeping.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from audio_codecs.opus import OpusDecoder, OpusEncoder
from gateway.aec import EchoCanceller, EchoReference
from gateway.config import VADConfig
from gateway.device.listener import Listener, UtteranceStarted
from scripts.echo_path import EchoPath

RATE = 16000
FRAME = 960
FRAME_MS = 60.0


@dataclass
class SimResult:
    mic: np.ndarray  # what the device sent (int16)
    out: np.ndarray  # what the canceller made of it
    canceller: EchoCanceller
    true_delay_ms: float
    cpu_s: float  # thread CPU time spent in the canceller


def simulate(
    reply: np.ndarray,
    path: EchoPath,
    *,
    timestamps: bool,
    play_lag_ms: float = 30.0,
    network_ms: float = 15.0,
    near: np.ndarray | None = None,
    near_at_s: float = 0.0,
    noise_dbfs: float = -65.0,
    seed: int = 0,
    linear: bool = True,  # the double-talk stage beside AEC3 (asr.aec_double_talk, on by default)
    pause_at_s: float | None = None,
    pause_frames: int = 0,
    device_late_ms: float = 0.0,
) -> SimResult:
    """One reply through `path`; with `pause_at_s`, the server stops sending for `pause_frames`
    frame periods there (synthesis fell behind), and the device resumes playing `device_late_ms`
    later than the server's model says (its own pause was longer: delivery jitter)."""
    encoder = OpusEncoder(RATE, 60)
    packets = encoder.encode(reply.astype(np.int16)) + encoder.flush()
    uplink_encoder, uplink_decoder = OpusEncoder(RATE, 60), OpusDecoder(RATE)  # the device's microphone codec
    canceller = EchoCanceller(EchoReference(), linear=linear)
    decoder = OpusDecoder(RATE)
    rng = np.random.default_rng(seed)
    total = len(packets) + pause_frames + 10  # uplink frames: the reply and a little after
    paused = len(packets) if pause_at_s is None else int(pause_at_s * 1000 / FRAME_MS)
    loudspeaker = np.zeros((total + 2) * FRAME, np.int16)
    stamps: list[tuple[float, int]] = []  # (device play start ms, stamp)
    t0 = 1000.0  # session clock (ms) when the reply starts
    mics, outs = [], []
    cpu = 0.0
    for j in range(total):
        now = t0 + j * FRAME_MS
        # the server sends one packet per frame period (the pacer's steady state), but for a pause
        k = j if j < paused else j - pause_frames
        if k < len(packets) and (j < paused or k >= paused):
            start = canceller.reference.add_packet(packets[k], now)
            stamp = int(start)
            play = start + play_lag_ms + (device_late_ms if k >= paused else 0.0)
            pos = int(round((play - t0) * RATE / 1000))
            pcm = decoder.decode(packets[k])
            loudspeaker[pos : pos + pcm.size] = pcm[: loudspeaker.size - pos]
            stamps.append((play, stamp))
        capture_start = now  # the device captures frame j over [now, now + 60 ms)
        lo = int(round((capture_start - t0) * RATE / 1000))
        mic = path.feed(loudspeaker[lo : lo + FRAME])
        if near is not None:
            at = lo - int(near_at_s * RATE)
            if at + FRAME > 0 and at < near.size:
                part = near[max(at, 0) : at + FRAME].astype(np.float64)
                first = max(-at, 0)
                mic[first : first + part.size] += part
        mic += rng.standard_normal(FRAME) * 32768 * 10 ** (noise_dbfs / 20)
        mic = np.clip(mic, -32768, 32767).astype(np.int16)
        # the uplink is Opus like a device's: codec noise a linear filter cannot cancel (~-15 dB of the echo)
        mic = np.concatenate([uplink_decoder.decode(p) for p in uplink_encoder.encode(mic)])
        end = capture_start + FRAME_MS
        stamp = next((s for p, s in reversed(stamps) if p <= end and end - p < 120), 0) if timestamps else 0
        before = time.thread_time()
        outs.append(canceller.process(mic, end + network_ms, stamp))
        cpu += time.thread_time() - before
        mics.append(mic)
    # the delay as the canceller sees it: our play-time model to the uplink's arrival-based clock
    true_delay = play_lag_ms + path.delay_ms + network_ms
    return SimResult(np.concatenate(mics), np.concatenate(outs), canceller, true_delay, cpu)


def erle_db(mic: np.ndarray, out: np.ndarray) -> float:
    energy_in = float(np.sum(mic.astype(np.float64) ** 2))
    energy_out = float(np.sum(out.astype(np.float64) ** 2))
    return 10 * np.log10(energy_in / max(energy_out, 1.0))


def onsets(out: np.ndarray) -> list[float]:
    """Seconds (stream time) at which the session's VAD (default config) confirms speech."""
    listener = Listener(VADConfig())
    times = []
    for i in range(0, out.size - FRAME + 1, FRAME):
        for event in listener.push_pcm(out[i : i + FRAME]):
            if isinstance(event, UtteranceStarted):
                times.append((i + FRAME) / RATE)
    return times
