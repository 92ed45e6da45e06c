"""Voice activity detection: Silero VAD (ONNX, onnxruntime) and endpointing.

The model file ships in the `silero-vad` wheel; it is located without importing
the package (whose import pulls in torch and changes torch's thread count). It
is the wheel's 16 kHz "sequence" export, which gives the same probabilities as
the streaming model but takes all the windows of a packet in one call. One ONNX
session serves the whole process; each stream keeps its own recurrent state and
the 64 samples of context the model expects before every 512-sample (32 ms)
window.

`Endpointer` turns window probabilities into speech boundaries with hysteresis:
speech starts at a window whose probability reaches `threshold` and counts once
it has lasted `min_speech_ms`; it ends where the probability fell below
`threshold_low`, once that has lasted `min_silence_ms` (a window back above
`threshold` cancels the pending end). The reported end is the last window at
or above `threshold`, less the model's lag (`END_LAG_WINDOWS`).
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from gateway.config import VADConfig

SAMPLE_RATE = 16000
WINDOW = 512  # samples per model call at 16 kHz (32 ms)
CONTEXT = 64  # samples of the previous window the model sees again
MODEL_FILE = "silero_vad_16k_sequence.onnx"
# Silero's probability stays above 0.5 for about two windows after speech stops
# (measured on espeak-ng speech through Opus, quiet to -35 dBFS noise); the
# reported end of speech is moved back by that much.
END_LAG_WINDOWS = 2


class VADUnavailable(Exception):
    """The Silero model file cannot be found or loaded."""


class VADInputError(ValueError):
    """Audio given to the VAD is not mono 16 kHz PCM."""


def find_silero_model(name: str = MODEL_FILE) -> Path:
    """Path of the ONNX file inside the installed `silero-vad` wheel (not imported)."""
    spec = importlib.util.find_spec("silero_vad")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        path = Path(location) / "data" / name
        if path.is_file():
            return path
    where = ", ".join(locations) or "nowhere (package not installed)"
    raise VADUnavailable(
        f"Silero VAD model {name} not found ({where}); install it with `pip install --no-deps silero-vad`"
    )


def as_float_pcm(pcm: np.ndarray) -> np.ndarray:
    """int16 or float mono PCM as float32 in [-1, 1]."""
    if not isinstance(pcm, np.ndarray) or pcm.ndim != 1:
        raise VADInputError("expected a 1-D numpy array of mono samples")
    if pcm.dtype == np.int16:
        return pcm.astype(np.float32) / 32768.0
    if np.issubdtype(pcm.dtype, np.floating):
        return pcm.astype(np.float32, copy=False)
    raise VADInputError(f"expected int16 or float samples, got {pcm.dtype}")


class SileroVAD:
    """One ONNX session shared by every stream (onnxruntime's `run` is thread-safe)."""

    def __init__(self, path: Path | None = None, *, threads: int = 1) -> None:
        path = path or find_silero_model()
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        try:
            self._session = ort.InferenceSession(
                str(path), sess_options=options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # onnxruntime raises its own, unexported error types
            raise VADUnavailable(f"cannot load Silero VAD from {path}: {exc}") from exc
        self.path = path

    @classmethod
    @functools.cache
    def shared(cls) -> SileroVAD:
        """The process-wide instance, loaded on first use."""
        return cls()

    def run(
        self, windows: np.ndarray, state: tuple[np.ndarray, np.ndarray]
    ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
        """Speech probabilities of consecutive (CONTEXT + WINDOW)-sample rows, and the next state."""
        probs, h, c = self._session.run(None, {"input": windows, "h": state[0], "c": state[1]})
        return probs, (h, c)

    def stream(self) -> VADStream:
        return VADStream(self)


class VADStream:
    """One audio stream's model state: probabilities of consecutive 32 ms windows."""

    def __init__(self, model: SileroVAD) -> None:
        self._model = model
        self.reset()

    def reset(self) -> None:
        zeros = np.zeros((1, 1, 128), dtype=np.float32)
        self._state = (zeros, zeros.copy())
        self._buffer = np.zeros(CONTEXT, dtype=np.float32)  # context + not yet windowed samples
        self.windows = 0

    def push(self, pcm: np.ndarray) -> list[float]:
        """Probabilities of the windows that this audio completes (in order)."""
        samples = as_float_pcm(pcm)
        buffer = np.concatenate([self._buffer, samples]) if samples.size else self._buffer
        count = (buffer.size - CONTEXT) // WINDOW
        if count <= 0:
            self._buffer = buffer
            return []
        rows = np.stack([buffer[i * WINDOW : i * WINDOW + CONTEXT + WINDOW] for i in range(count)])
        probs, self._state = self._model.run(rows, self._state)
        self._buffer = buffer[count * WINDOW :]
        self.windows += count
        return [float(p) for p in probs]


@dataclass(frozen=True, slots=True)
class SpeechStart:
    start: int  # sample of the first window of speech


@dataclass(frozen=True, slots=True)
class SpeechEnd:
    start: int
    end: int  # sample where the closing silence began


class Endpointer:
    """Hysteresis on window probabilities -> speech start / end, in samples."""

    def __init__(self, cfg: VADConfig, *, window: int = WINDOW) -> None:
        self.cfg = cfg
        self.window = window
        self._min_speech = cfg.min_speech_ms * SAMPLE_RATE // 1000
        self._min_silence = cfg.min_silence_ms * SAMPLE_RATE // 1000
        self.reset()

    def reset(self) -> None:
        self.windows = 0
        self.onset: int | None = None  # start of a possible or confirmed utterance
        self.confirmed = False  # lasted min_speech (SpeechStart sent)
        self._voiced_end = 0
        self._silence_from: int | None = None

    @property
    def position(self) -> int:
        return self.windows * self.window

    def push(self, prob: float) -> SpeechStart | SpeechEnd | None:
        """Feed the next window's probability; returns the boundary it completes, if any."""
        begin = self.position
        self.windows += 1
        end = self.position
        cfg = self.cfg
        if self.onset is None:
            if prob < cfg.threshold:
                return None
            self.onset, self._voiced_end, self._silence_from = begin, end, None
        elif prob >= cfg.threshold:
            self._silence_from = None
            self._voiced_end = end
        elif prob < cfg.threshold_low and self._silence_from is None:
            self._silence_from = begin
        if self._silence_from is not None and end - self._silence_from >= self._min_silence:
            return self._finish()
        if not self.confirmed and self._voiced_end - self.onset >= self._min_speech:
            self.confirmed = True
            return SpeechStart(self.onset)
        return None

    def force_end(self) -> SpeechEnd | None:
        """Ends the current utterance here (length bound, `listen stop`)."""
        if self.onset is None:
            return None
        return self._finish()

    def _finish(self) -> SpeechEnd | None:
        onset, confirmed = self.onset, self.confirmed
        self.onset, self.confirmed, self._silence_from = None, False, None
        if onset is None or not confirmed:
            return None  # a blip shorter than min_speech
        return SpeechEnd(onset, max(onset + self.window, self._voiced_end - END_LAG_WINDOWS * self.window))


class VoiceActivityDetector:
    """A stream's model state plus its endpointer: PCM in, boundaries out."""

    def __init__(self, cfg: VADConfig, model: SileroVAD | None = None) -> None:
        self.stream = (model or SileroVAD.shared()).stream()
        self.endpointer = Endpointer(cfg)

    def reset(self) -> None:
        self.stream.reset()
        self.endpointer.reset()

    def feed(self, pcm: np.ndarray) -> list[SpeechStart | SpeechEnd]:
        events = []
        for prob in self.stream.push(pcm):
            event = self.endpointer.push(prob)
            if event is not None:
                events.append(event)
        return events
