"""Device models for the server-AEC simulation (scripts/aec_sim.simulate_device, scripts/bench_aec.py).

A model says how a device plays our downlink and what its uplink carries; `DeviceModel.draw`
turns it into one `Trial` (concrete numbers) from a seeded generator.

* Server: the real `Pacer` sends the reply with `lead_frames` of lead (config
  `audio.prebuffer_frames`); synthesis may stall once (`stall_ms`), after which the rest
  comes at once and the pacer re-bases.
* Network: each downlink packet takes `down_ms` plus up to `jitter_ms` more, in order;
  with `burst_ms` the network holds packets and delivers them together every `burst_ms`
  (the device's queue depth then varies in steps). The uplink likewise (`up_ms`, `up_jitter_ms`).
* Playout: a jitter buffer. Playback starts once `start_frames` frames are queued, plays one
  60 ms frame after another on the device's clock (off by `drift_ppm` from ours) and, run
  dry, pauses until `start_frames` are queued again. It (re)starts on the device's
  `grain_ms` tick: 60 for a loop that plays a frame and sends one (xiaozhi-sdk driven by a
  test), 10 for an I2S DMA block.
* Uplink: `mic`: 60 ms of microphone sent once captured (firmware); `playing`: the frame
  being played, sent as it starts (the independent test of issue 23 drove xiaozhi-sdk so):
  its echo is 60 ms earlier than a microphone's would be.
* Echo: `plain` (a scaled copy, sample-aligned, nothing else), `room` (the old bench's
  path: 40-250 ms delay, 15-40 ms room response, light clipping) or `reverb` (a
  reverberant room: 10-60 ms delay, 250-400 ms response, RT60 0.3-0.6 s, the tail 0-10 dB
  under the direct sound); `gain_db` drawn in `gains_db` (-20..0 dB: 0 is echo as loud as
  what we sent; both room responses are scaled to unit energy).
* v1 (no timestamps) or v2: a v2 uplink frame carries the stamp of the last packet that
  started playing by the time it is sent (within 120 ms; else 0).

`legacy-v2`/`legacy-v1` are the model the bench had before (scripts/aec_sim.simulate):
the device plays 30 ms after our play-time model, the uplink frames line up with our
frame periods, the room path; the bench runs them through that function unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from gateway.speech.pacer import Pacer
from scripts.echo_path import EchoPath, reverberant_impulse_response, room_impulse_response

FRAME_MS = 60.0
Uplink = Literal["mic", "playing"]
Echo = Literal["plain", "room", "reverb"]


@dataclass(frozen=True)
class DeviceModel:
    name: str
    about: str
    timestamps: bool
    uplink: Uplink = "mic"
    echo: Echo = "plain"
    gains_db: tuple[float, float] = (-20.0, 0.0)
    grain_ms: float = 10.0
    start_frames: tuple[int, int] = (1, 1)  # drawn in this range (inclusive)
    lead_frames: tuple[int, int] = (5, 5)
    down_ms: tuple[float, float] = (5.0, 30.0)
    jitter_ms: float = 0.0
    burst_ms: tuple[float, float] = (0.0, 0.0)  # 0: no bursts
    up_ms: tuple[float, float] = (5.0, 30.0)
    up_jitter_ms: float = 0.0
    drift_ppm: float = 0.0  # drawn in +-this
    stall_ms: tuple[float, float] = (0.0, 0.0)  # one synthesis stall of this long, 2-5 s into the reply
    noise_dbfs: float | None = -65.0
    legacy: bool = False  # scripts/aec_sim.simulate (the old bench model)

    def draw(self, rng: np.random.Generator) -> Trial:
        """One trial's numbers (the echo path's room response is drawn from them when built)."""
        burst = float(rng.uniform(*self.burst_ms))
        stall = float(rng.uniform(*self.stall_ms))
        return Trial(
            model=self,
            gain_db=float(rng.uniform(*self.gains_db)),
            start_frames=int(rng.integers(self.start_frames[0], self.start_frames[1] + 1)),
            lead_frames=int(rng.integers(self.lead_frames[0], self.lead_frames[1] + 1)),
            down_ms=float(rng.uniform(*self.down_ms)),
            burst_ms=burst,
            up_ms=float(rng.uniform(*self.up_ms)),
            drift_ppm=float(rng.uniform(-self.drift_ppm, self.drift_ppm)),
            stall_ms=stall,
            stall_at_s=float(rng.uniform(2.0, 5.0)) if stall > 0 else 0.0,
            lead_in_ms=float(rng.uniform(300.0, 1500.0)),
            path_delay_ms=float(rng.uniform(40, 250)) if self.echo == "room" else float(rng.uniform(10, 60)),
            rir_ms=float(rng.uniform(15, 40)) if self.echo == "room" else float(rng.uniform(250, 400)),
            rt60_ms=float(rng.uniform(300, 600)),
            drr_db=float(rng.uniform(0, 10)),
            path_seed=int(rng.integers(1 << 30)),
            seed=int(rng.integers(1 << 30)),
        )


@dataclass(frozen=True)
class Trial:
    model: DeviceModel
    gain_db: float
    start_frames: int = 1
    lead_frames: int = 5
    down_ms: float = 20.0
    burst_ms: float = 0.0
    up_ms: float = 20.0
    drift_ppm: float = 0.0
    stall_ms: float = 0.0
    stall_at_s: float = 0.0
    lead_in_ms: float = 1000.0  # the uplink runs this long before the reply (realtime mode: always on)
    path_delay_ms: float = 0.0
    rir_ms: float = 30.0
    rt60_ms: float = 400.0
    drr_db: float = 5.0
    path_seed: int = 0
    seed: int = 0
    clean: bool = False  # no echo at all (the device cancels it, or plays through headphones)

    def path(self) -> EchoPath | None:
        if self.clean:
            return None
        echo = self.model.echo
        if echo == "plain":
            return EchoPath(delay_ms=0.0, gain_db=self.gain_db, rir=np.ones(1), clip=1.0)
        if echo == "room":  # at unit energy, as the reverberant one: gain_db is the echo's level
            rir = room_impulse_response(length_ms=self.rir_ms, seed=self.path_seed)
            rir = rir / np.sqrt(np.sum(rir**2))
        else:
            rir = reverberant_impulse_response(self.rir_ms, self.rt60_ms, self.drr_db, seed=self.path_seed)
        return EchoPath(delay_ms=self.path_delay_ms, gain_db=self.gain_db, rir=rir)

    def with_clean_uplink(self) -> Trial:
        return replace(self, clean=True)


def send_times(trial: Trial, packets: int, t0_ms: float) -> list[float]:
    """When the server sends each packet (ms): the real pacer, synthesis ready at `t0_ms` but for
    one stall of `trial.stall_ms` after which the rest of the reply is ready at once."""
    now = t0_ms
    pacer = Pacer(frame_s=FRAME_MS / 1000, lead_frames=trial.lead_frames, clock=lambda: now / 1000)
    stall_from = int(trial.stall_at_s * 1000 / FRAME_MS) if trial.stall_ms > 0 else packets
    times = []
    for k in range(packets):
        if k == stall_from:
            now += trial.stall_ms
        now = max(now, pacer.next_due() * 1000)
        pacer.mark_sent()
        times.append(now)
    return times


def model_starts(sends: list[float]) -> list[float]:
    """Each packet's play start on the server's play-time model (gateway/aec/reference.py): its stamp."""
    starts, end = [], -math.inf
    for sent in sends:
        start = max(sent, end)
        starts.append(start)
        end = start + FRAME_MS
    return starts


def arrivals(sends: list[float], base_ms: float, jitter_ms: float, burst_ms: float, rng) -> list[float]:
    """In-order delivery: base delay, up to `jitter_ms` more, held for the next burst instant."""
    out, last = [], -math.inf
    phase = float(rng.uniform(0, burst_ms)) if burst_ms > 0 else 0.0
    for sent in sends:
        t = sent + base_ms + (float(rng.uniform(0, jitter_ms)) if jitter_ms > 0 else 0.0)
        if burst_ms > 0:
            t = phase + math.ceil((t - phase) / burst_ms) * burst_ms
        last = max(last, t)
        out.append(last)
    return out


def play_starts(arrived_dev: list[float], start_frames: int, grain_ms: float) -> list[float]:
    """Device play start of each frame (device ms): back to back while frames are there in time;
    run dry, (re)start on a `grain_ms` tick once `start_frames` are queued."""
    starts: list[float] = []
    cursor: float | None = None
    n = len(arrived_dev)
    for k, arrived in enumerate(arrived_dev):
        if cursor is not None and arrived <= cursor:
            start = cursor
        else:
            ready = arrived_dev[min(k + start_frames - 1, n - 1)]
            t = max(ready, cursor if cursor is not None else -math.inf)
            start = math.ceil(t / grain_ms - 1e-9) * grain_ms
        starts.append(start)
        cursor = start + FRAME_MS
    return starts


SDK = dict(uplink="playing", grain_ms=60.0, down_ms=(2.0, 30.0), up_ms=(2.0, 30.0), noise_dbfs=None)
JITTER = dict(
    start_frames=(1, 3),
    lead_frames=(3, 8),
    jitter_ms=30.0,
    burst_ms=(60.0, 240.0),
    up_jitter_ms=30.0,
)
STALL = dict(JITTER, stall_ms=(200.0, 800.0))

MODELS: dict[str, DeviceModel] = {
    m.name: m
    for m in [
        DeviceModel("legacy-v2", "the old bench model, v2 timestamps", True, echo="room", legacy=True),
        DeviceModel("legacy-v1", "the old bench model, no timestamps", False, echo="room", legacy=True),
        DeviceModel(
            "sdk-plain-v1",
            "issue 23's test: xiaozhi-sdk plays a frame per 60 ms tick and sends it scaled, v1",
            False,
            drift_ppm=100.0,
            **SDK,
        ),
        DeviceModel("sdk-plain-v2", "the same with v2 timestamps", True, drift_ppm=100.0, **SDK),
        DeviceModel(
            "jitter-plain-v1",
            "firmware-like: bursty downlink (60-240 ms), jitter buffer starting at 1-3 frames, plain echo",
            False,
            drift_ppm=300.0,
            **JITTER,
        ),
        DeviceModel(
            "jitter-room-v2", "the same over a room path, v2 timestamps", True, echo="room", **JITTER
        ),
        DeviceModel(
            "reverb-v1",
            "reverberant room (RT60 0.3-0.6 s), bursty jitter buffer, +-1000 ppm drift, v1",
            False,
            echo="reverb",
            drift_ppm=1000.0,
            **JITTER,
        ),
        DeviceModel(
            "reverb-v2", "the same with v2 timestamps", True, echo="reverb", drift_ppm=1000.0, **JITTER
        ),
        DeviceModel(
            "stall-plain-v1",
            "jitter-plain-v1 with a synthesis stall of 0.2-0.8 s 2-5 s in: playback resumes, the echo moves",
            False,
            drift_ppm=300.0,
            **STALL,
        ),
        DeviceModel("stall-room-v2", "jitter-room-v2 with that stall", True, echo="room", **STALL),
    ]
}
