"""A stand-in for a GPU model, for benchmarks of the engine's process layout (in-process vs worker).

On a GPU, one batched step of a real model costs two things: host-side Python that launches kernels (it
holds the GIL, and competes with WebSocket I/O, pacing and Opus when the engine shares the gateway's
interpreter) and the GPU's own time, during which the host thread waits on a CUDA sync with the GIL
released. ``GpuSimBackend.step()`` reproduces that shape: ``python_ms`` of pure-Python work (holding the
GIL) then ``step_ms`` of ``time.sleep`` (which releases it), whatever the batch size, as a batched
kernel's time barely grows with its rows. Each stream advances ``chunk_ms`` of audio per step (40 ms: one
CosyVoice speech token at 25 Hz), so a sentence takes many steps and concurrent streams batch; like
CosyVoice, which vocodes in hops of tokens, the audio leaves every ``hop_chunks`` steps (an empty chunk
in between), so the engine delivers chunks at the rate the fake backend does (200 ms by default).

The audio is the fake backend's tone (same voices, pitches, lengths and ``fail_on`` marker).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from tts_engine.backends.base import BackendStream
from tts_engine.backends.fake import FakeBackend, FakeStream

_NO_AUDIO = np.zeros(0, np.float32)
_NO_AUDIO.flags.writeable = False


def hold_gil_for(seconds: float) -> int:
    """Pure-Python busy work for ``seconds`` (no C call that drops the GIL); returns the loop count.

    CPython still hands the GIL to a waiting thread every ``sys.getswitchinterval()`` (5 ms), as it does
    for real launch code, so other threads are slowed, not frozen.
    """
    deadline = time.perf_counter() + seconds
    count = 0
    acc = 0
    while time.perf_counter() < deadline:
        for i in range(64):  # a few bytecodes per perf_counter call, like argument packing per launch
            acc = (acc + i * i) & 0xFFFF
        count += 1
    return count


class HopStream(BackendStream):
    """A fake stream advanced one ``chunk_ms`` token a step, its audio handed out ``hop_chunks`` at a time."""

    def __init__(self, inner: FakeStream, hop_chunks: int) -> None:
        self._inner = inner
        self._hop_chunks = hop_chunks
        self._pending: list[np.ndarray] = []

    def next_chunk(self) -> np.ndarray | None:
        chunk = self._inner.next_chunk()
        if chunk is None:  # the end: what is left, then None
            if not self._pending:
                return None
            tail, self._pending = np.concatenate(self._pending), []
            return tail
        self._pending.append(chunk)
        if len(self._pending) < self._hop_chunks:
            return _NO_AUDIO
        hop, self._pending = np.concatenate(self._pending), []
        return hop

    def close(self) -> None:
        self._inner.close()


class GpuSimBackend(FakeBackend):
    """Fake tone audio with a GPU-like batched step: ``python_ms`` holding the GIL + ``step_ms`` not."""

    name = "gpu-sim"

    def __init__(
        self,
        sample_rate: int = 24000,
        *,
        step_ms: float = 20.0,
        python_ms: float = 5.0,
        chunk_ms: int = 40,
        hop_chunks: int = 5,
        max_batch_size: int = 128,
        **tone: Any,
    ) -> None:
        """``tone``: the fake backend's options for the audio (``ms_per_char``, ``fail_on``, ``voices``)."""
        super().__init__(sample_rate, chunk_ms=chunk_ms, **tone)
        for name, value, least in (
            ("step_ms", step_ms, 0), ("python_ms", python_ms, 0), ("max_batch_size", max_batch_size, 1),
            ("hop_chunks", hop_chunks, 1),
        ):  # fmt: skip
            if value < least:
                raise ValueError(f"{name} must be >= {least}, got {value}")
        self.hop_chunks = hop_chunks
        self.step_ms = step_ms
        self.python_ms = python_ms
        self.max_batch_size = max_batch_size
        self.num_steps = 0
        self.num_step_streams = 0

    def open_stream(self, text: str, voice: str, speed: float) -> HopStream:  # type: ignore[override]
        return HopStream(super().open_stream(text, voice, speed), self.hop_chunks)

    def step(
        self, streams: list[BackendStream], *args: Any, **kwargs: Any
    ) -> list[np.ndarray | None | BaseException]:
        """One batched step; further arguments (the engine's step budget) go to the fake's step."""
        if streams:
            if self.python_ms > 0:
                hold_gil_for(self.python_ms / 1000)  # kernel launches: host Python, GIL held
            if self.step_ms > 0:
                time.sleep(self.step_ms / 1000)  # the GPU computing, the host waiting on a sync: GIL free
            self.num_steps += 1
            self.num_step_streams += len(streams)
        return super().step(streams, *args, **kwargs)

    def step_stats(self) -> dict[str, int | float]:
        return {"gpu_sim_steps": self.num_steps, "gpu_sim_step_streams": self.num_step_streams}
