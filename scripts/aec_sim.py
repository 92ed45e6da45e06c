"""Offline server-AEC simulation shared by tests/test_aec*.py and scripts/bench_aec.py.

The server's side is the real `EchoCanceller` fed as the session feeds it
(downlink packets into the reference when sent, uplink frames with their
arrival times and v2 stamps). Time is simulated: no sleeping.

* `simulate`: the first device model (`legacy-*` in scripts/aec_devices.py): the
  device plays each packet `play_lag_ms` after the server's model says, and its
  microphone hears an `EchoPath` of that plus optional near-end speech.
* `simulate_device`: a `Trial` of a device model (scripts/aec_devices.py): the
  real pacer sends, the network delivers (bursts, jitter), the device plays from
  its jitter buffer on its own clock and sends its uplink as the model says.
"""

from __future__ import annotations

import bisect
import math
import time
from dataclasses import dataclass

import numpy as np

from audio_codecs.opus import OpusDecoder, OpusEncoder
from gateway.aec import EchoCanceller, EchoReference
from gateway.config import VADConfig
from gateway.device.listener import Listener, UtteranceStarted
from scripts.aec_devices import FRAME_MS as DEVICE_FRAME_MS
from scripts.aec_devices import Trial, arrivals, model_starts, play_starts, send_times
from scripts.echo_path import EchoPath

RATE = 16000
FRAME = 960
FRAME_MS = 60.0
UPLINK_CODEC_MS = 6.5  # libopus's algorithmic delay on the uplink (the delay estimate includes it)


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


@dataclass
class DeviceResult:
    mic: np.ndarray  # what the device sent (int16), one sample per device sample from its first frame
    out: np.ndarray  # what the canceller made of it
    canceller: EchoCanceller
    cpu_s: float  # thread CPU time spent in the canceller
    reply_start_s: float  # stream time at which the device started playing the reply
    near_start_s: float | None  # stream time at which near-end speech starts
    underruns: int  # times the device's jitter buffer ran dry before the reply's end
    # per packet: where its echo sits in the uplink against our play-time model, on the canceller's
    # capture clock (first arrival less a frame, then sample counting); what alignment should find
    true_delays_ms: np.ndarray


def simulate_device(
    reply: np.ndarray,
    trial: Trial,
    *,
    near: np.ndarray | None = None,
    near_at_s: float = 0.0,
    linear: bool = True,
    tail_s: float = 0.6,
) -> DeviceResult:
    """One reply played by a device model's `trial`; `near` (int16) starts `near_at_s` after the
    device started playing. Stream times count the device's uplink samples from its first frame."""
    model = trial.model
    rng = np.random.default_rng(trial.seed)
    encoder = OpusEncoder(RATE, 60)
    packets = encoder.encode(reply.astype(np.int16)) + encoder.flush()
    decoder = OpusDecoder(RATE)
    pcms = [decoder.decode(p) for p in packets]
    t0 = 5000.0  # session clock (ms) when the reply starts
    u0 = t0 - trial.lead_in_ms  # server time of the device's first uplink sample
    scale = 1 + trial.drift_ppm * 1e-6  # server ms per device ms

    sends = send_times(trial, len(packets), t0)
    stamps = model_starts(sends)
    down = arrivals(sends, trial.down_ms, model.jitter_ms, trial.burst_ms, rng)
    plays = play_starts([(a - u0) / scale for a in down], trial.start_frames, model.grain_ms)
    underruns = sum(1 for a, b in zip(plays, plays[1:], strict=False) if b > a + DEVICE_FRAME_MS + 1e-6)
    frames = int(math.ceil((plays[-1] + DEVICE_FRAME_MS + tail_s * 1000) / DEVICE_FRAME_MS))
    loudspeaker = np.zeros((frames + 1) * FRAME, np.int16)
    for start, pcm in zip(plays, pcms, strict=True):
        pos = int(round(start * RATE / 1000))
        loudspeaker[pos : pos + pcm.size] = pcm

    path = trial.path()
    near_start = None if near is None else int(round((plays[0] + near_at_s * 1000) * RATE / 1000))
    noise = None if model.noise_dbfs is None else 32768 * 10 ** (model.noise_dbfs / 20)
    uplink_encoder, uplink_decoder = OpusEncoder(RATE, 60), OpusDecoder(RATE)
    canceller = EchoCanceller(EchoReference(), linear=linear)
    mics, outs, cpu, sent, last_arrival = [], [], 0.0, 0, -math.inf
    anchor = None
    for j in range(frames):
        lo = j * FRAME
        mic = path.feed(loudspeaker[lo : lo + FRAME]) if path is not None else np.zeros(FRAME)
        if near is not None and near_start is not None:
            at = lo - near_start
            if at + FRAME > 0 and at < near.size:
                part = near[max(at, 0) : at + FRAME].astype(np.float64)
                first = max(-at, 0)
                mic[first : first + part.size] += part
        if noise is not None:
            mic += rng.standard_normal(FRAME) * noise
        mic = np.clip(mic, -32768, 32767).astype(np.int16)
        mic = np.concatenate([uplink_decoder.decode(p) for p in uplink_encoder.encode(mic)])
        # a microphone frame leaves once captured; the sdk test sent the frame it was starting to play
        send_dev = (j + 1) * DEVICE_FRAME_MS if model.uplink == "mic" else j * DEVICE_FRAME_MS
        jitter = float(rng.uniform(0, model.up_jitter_ms)) if model.up_jitter_ms > 0 else 0.0
        arrival = last_arrival = max(last_arrival, u0 + send_dev * scale + trial.up_ms + jitter)
        anchor = arrival - DEVICE_FRAME_MS if anchor is None else anchor
        stamp = 0
        if model.timestamps:  # the last packet that started playing by the time the frame leaves
            k = bisect.bisect_right(plays, send_dev + 1e-6) - 1
            if k >= 0 and send_dev - plays[k] < 120:
                stamp = int(stamps[k]) & 0xFFFFFFFF
        while sent < len(packets) and sends[sent] <= arrival:
            canceller.reference.add_packet(packets[sent], sends[sent])
            sent += 1
        before = time.thread_time()
        outs.append(canceller.process(mic, arrival, stamp))
        cpu += time.thread_time() - before
        mics.append(mic)
    return DeviceResult(
        np.concatenate(mics),
        np.concatenate(outs),
        canceller,
        cpu,
        plays[0] / 1000,
        None if near_start is None else near_start / RATE,
        underruns,
        np.asarray(plays)
        + UPLINK_CODEC_MS
        + (path.delay_ms if path is not None else 0.0)
        + (anchor or 0.0)
        - np.asarray(stamps),
    )


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
