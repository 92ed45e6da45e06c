"""What the echo canceller (canceller.py) sends on, per 10 ms chunk: AEC3's output, the user's words
whole where they talk, nothing where AEC3 may leak echo.

Echo ceiling (ceiling.py): how loud the echo can be in each chunk, learnt
without its delay. Far above it a chunk is the user's, whatever AEC3 makes of
it: with little or no echo (a clean uplink) AEC3, whose filter has nothing to
converge on, ducked speech wherever we played (the user found 0.6-2 s late).

Guard: while AEC3 may leak echo, a chunk that may only be echo and that the
stage does not take for talk is muted: for the first GUARD_S of reply played
(AEC3 can leak ~1 s into the first reply), for RESUME_GUARD_S after a resume or
a slip, and while AEC3 shows that it leaks (over the last loud chunks that may
only be echo it took off under 20 dB; converged it takes off 30-45). "May only
be echo": the stage's Geigel test where it has learnt the echo path
(linear.LinearStage.echo_like), else at or under the ceiling.

Residual cap: where the stage has converged and sees no talk, AEC3's output in a
chunk that may only be echo (either test) is held RESIDUAL (40 dB) under the
microphone. AEC3 converged takes 30-45 dB off; a reverberant room's tail at the
ends of words it took only 15-25 dB off, and the VAD (Silero, which hardly
minds the level) took the ~-45 dBFS left for speech. Speech under the echo that
the stage does not take for talk AEC3 ducks by 20-40 dB anyway.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from gateway.aec.ceiling import ECHO_DB, TALK_DB, EchoCeiling
from gateway.aec.linear import HOLD_CHUNKS, LinearStage
from gateway.aec.stages import CHUNK

GUARD_S = 2.0  # AEC3 may leak echo this early in a session (s of reply played): the early guard
RESUME_GUARD_S = 1.5  # ... and this long after playback resumes (the echo may have moved)
LEAK_CHUNKS = 20  # AEC3's recent cancelling, over this many loud chunks that may only be echo ...
LEAK = 10 ** (20.0 / 10)  # ... leaks below this (median)
LOUD_RMS = 100.0  # ... chunks this loud (-50 dBFS)
TALK = 10 ** (TALK_DB / 10)
ECHO = 10 ** (ECHO_DB / 10)
# where a converged stage sees no talk and the chunk may only be echo, AEC3's output is kept this far
# (40 dB) under the microphone: in a reverberant room (RT60 0.6 s) AEC3 takes 15-25 dB off the tail at
# the end of words, and the ~-45 dBFS left was speech to the VAD (bench reverb-v1: a false barge-in)
RESIDUAL = 10 ** (40.0 / 10)


class EchoGuard:
    """The per-chunk choice between AEC3's output, the user's words whole and silence."""

    def __init__(self, ceiling: EchoCeiling) -> None:
        self.ceiling = ceiling
        self.guarding = False  # the last frame muted what may only be echo (AEC3 may leak)
        self._talk_hold = 0
        self._leaks: deque[float] = deque(maxlen=LEAK_CHUNKS)  # mic / AEC3 output powers, echo alone
        self._guard_until_ms = 0.0  # capture time: muting what may be echo (AEC3 may leak) until then
        self._held_back = np.zeros(0, bool)  # this frame's chunks of talk just before a resume: muted

    def restart(self, capture_ms: float) -> None:
        """Playback resumed (or the echo slipped away from the stage): the echo may have moved. Mute
        what may be echo for RESUME_GUARD_S from `capture_ms` on."""
        self._guard_until_ms = capture_ms + RESUME_GUARD_S * 1000
        self._leaks.clear()  # how AEC3 cancelled before says nothing of how it does now

    def hold_back(self, chunks: np.ndarray) -> None:
        """This frame's chunks of talk that may be the echo coming back early at a resume: muted
        (resume.py)."""
        self._held_back = chunks

    def choose(
        self,
        pcm: np.ndarray,
        capture_ms: float,
        out: np.ndarray,
        ran: tuple[np.ndarray, np.ndarray] | None,
        stage: LinearStage | None,
        played_s: float,
    ) -> np.ndarray:
        """Per 10 ms chunk: AEC3's output; where the user talks, their words whole (the linear
        stage's double talk, or far above what the echo can be: the ceiling); while AEC3 may leak
        (the guards), nothing where it may be echo. `played_s`: s of reply played so far."""
        chunks = pcm.size // CHUNK
        if not chunks:
            return out
        power = np.mean(pcm[: chunks * CHUNK].astype(np.float64).reshape(chunks, CHUNK) ** 2, axis=1)
        bound = self.ceiling.push(power, capture_ms)
        learnt = self.ceiling.gain2 is not None
        talk = np.zeros(chunks, bool) if ran is None else ran[1]
        whole = pcm if ran is None else ran[0]  # the linear stage's output: less the echo it predicts
        if ran is not None and stage is not None and stage.learnt and not stage.doubted:
            may_be_echo = stage.echo_like()  # aligned: what the echo path makes of the reference just played
        else:
            may_be_echo = power <= bound * ECHO  # wherever the echo is: the ceiling
        held_back = self._held_back if self._held_back.size == chunks else np.zeros(chunks, bool)
        self._held_back = np.zeros(0, bool)
        leaking = self._aec3_leaking(power, out, may_be_echo & ~talk)
        # the stage knows the echo path and sees no talk: AEC3's output where it may only be echo is
        # held under RESIDUAL (the ceiling's bound too: Geigel's is a 95th percentile)
        knows = (
            ran is not None and stage is not None and stage.learnt and stage.converged and not stage.doubted
        )
        capped = (may_be_echo | (power <= bound * ECHO)) & knows
        guard = played_s < GUARD_S or capture_ms < self._guard_until_ms or leaking
        self.guarding = guard
        for k in range(chunks):
            part = slice(k * CHUNK, (k + 1) * CHUNK)
            if learnt and power[k] > bound[k] * TALK:
                self._talk_hold = HOLD_CHUNKS
            elif self._talk_hold:
                self._talk_hold -= 1
            elif not talk[k]:
                if (guard and may_be_echo[k]) or held_back[k]:
                    out[part] = 0
                elif capped[k]:
                    kept = float(np.mean(out[part].astype(np.float64) ** 2))
                    if kept * RESIDUAL > power[k]:
                        scale = np.sqrt(power[k] / (RESIDUAL * kept))
                        out[part] = np.round(out[part] * scale).astype(np.int16)
                continue
            out[part] = whole[part]
        return out

    def _aec3_leaking(self, power: np.ndarray, out: np.ndarray, echo: np.ndarray) -> bool:
        """Whether AEC3 lets echo through: over the last LEAK_CHUNKS loud chunks that may only be
        echo, it took off less than LEAK_DB (median). Converged it takes off 30-45 dB; it leaks
        for seconds where the echo moved (the device resumed later or sooner than we did, or ran
        dry) or early on, at times only 5 dB. The user's words under the echo's level count too;
        the guard then mutes them, as AEC3 would duck most of them."""
        chunks = power.size
        kept = out[: chunks * CHUNK].astype(np.float64).reshape(chunks, CHUNK)
        left = np.mean(kept**2, axis=1)
        for k in np.flatnonzero(echo & (power > LOUD_RMS**2)):
            self._leaks.append(float(power[k] / max(left[k], 1.0)))
        return len(self._leaks) >= LEAK_CHUNKS // 4 and float(np.median(self._leaks)) < LEAK
