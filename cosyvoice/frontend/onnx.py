"""The two ONNX models of the CosyVoice3 frontend, run with onnxruntime.

* ``campplus.onnx`` (CAM++ speaker encoder): input 0 float32 ``[1, T, 80]`` (mean-normalised Kaldi
  fbank) -> output 0 ``[1, 192]``. Runs on the CPU provider with one intra-op thread, as upstream.
* ``speech_tokenizer_v3.onnx``: input 0 float32 ``[1, 128, T]`` (whisper log-mel), input 1 int32
  ``[1]`` = T -> output 0 int tokens at 25 Hz (``[1, 1, T']`` in the release; flattened here).
  Prefers the CUDA provider when onnxruntime offers it.

Inputs are addressed by position, as upstream does, so the graphs' input names do not matter.
Results come back as CPU tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from torch import Tensor

from cosyvoice.frontend.features import campplus_fbank, whisper_log_mel

__all__ = ["MAX_PROMPT_SECONDS", "CampPlus", "OnnxModelError", "SpeechTokenizerV3", "default_providers"]

MAX_PROMPT_SECONDS = 30.0  # the speech tokenizer refuses longer audio upstream
_CPU = "CPUExecutionProvider"
_CUDA = "CUDAExecutionProvider"


class OnnxModelError(RuntimeError):
    """An ONNX file is missing or unusable, or its input does not fit the model."""


def default_providers(prefer_cuda: bool) -> list[str]:
    """``[CUDA, CPU]`` when CUDA is wanted and onnxruntime has it, else ``[CPU]``."""
    if prefer_cuda and _CUDA in ort.get_available_providers():
        return [_CUDA, _CPU]
    return [_CPU]


def _open_session(path: str | Path, providers: Sequence[str], threads: int) -> ort.InferenceSession:
    path = Path(path)
    if not path.is_file():
        raise OnnxModelError(f"{path}: ONNX model file not found")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    try:
        return ort.InferenceSession(str(path), sess_options=options, providers=list(providers))
    except Exception as exc:  # onnxruntime raises its own exception types for bad graphs
        raise OnnxModelError(f"{path}: cannot load ONNX model: {exc}") from exc


class CampPlus:
    """CAM++ speaker embedding from 16 kHz audio."""

    def __init__(self, path: str | Path, *, providers: Sequence[str] | None = None, threads: int = 1) -> None:
        self.path = Path(path)
        self._session = _open_session(path, providers or default_providers(False), threads)
        inputs = self._session.get_inputs()
        if len(inputs) < 1:
            raise OnnxModelError(f"{self.path}: expected one input (fbank [1, T, 80])")
        self._input_name = inputs[0].name

    def embed(self, fbank: Tensor) -> Tensor:
        """Mean-normalised fbank ``[T, 80]`` (or ``[1, T, 80]``) -> embedding float32 ``[1, D]`` (D = 192)."""
        if fbank.dim() == 2:
            fbank = fbank[None]  # [1, T, 80]
        if fbank.dim() != 3 or fbank.shape[0] != 1 or fbank.shape[1] < 1:
            raise OnnxModelError(f"{self.path}: expected fbank [T, 80] with T >= 1, got {tuple(fbank.shape)}")
        feed = {self._input_name: fbank.detach().to("cpu", torch.float32).contiguous().numpy()}
        output = self._session.run(None, feed)[0]
        return torch.from_numpy(np.asarray(output, dtype=np.float32).reshape(1, -1).copy())  # [1, D]

    def embed_wave(self, wave16k: Tensor) -> Tensor:
        """16 kHz waveform ``[1, N]`` -> embedding ``[1, D]``."""
        return self.embed(campplus_fbank(wave16k))


class SpeechTokenizerV3:
    """Supervised semantic speech tokens (25 Hz, 6561 codes) from 16 kHz audio."""

    def __init__(self, path: str | Path, *, providers: Sequence[str] | None = None, threads: int = 1) -> None:
        self.path = Path(path)
        self._session = _open_session(path, providers or default_providers(True), threads)
        inputs = self._session.get_inputs()
        if len(inputs) < 2:
            raise OnnxModelError(f"{self.path}: expected two inputs (feats [1, 128, T], feats_length [1])")
        self._feats_name, self._length_name = inputs[0].name, inputs[1].name

    def tokenize(self, log_mel: Tensor) -> Tensor:
        """Whisper log-mel ``[1, 128, T]`` -> speech tokens int32 ``[1, T']``."""
        if log_mel.dim() != 3 or log_mel.shape[0] != 1 or log_mel.shape[2] < 1:
            raise OnnxModelError(f"{self.path}: expected log-mel [1, 128, T], got {tuple(log_mel.shape)}")
        feed = {
            self._feats_name: log_mel.detach().to("cpu", torch.float32).contiguous().numpy(),
            self._length_name: np.array([log_mel.shape[2]], dtype=np.int32),
        }
        tokens = np.asarray(self._session.run(None, feed)[0]).reshape(1, -1)  # [1, T']
        return torch.from_numpy(tokens.astype(np.int32))

    def tokenize_wave(self, wave16k: Tensor) -> Tensor:
        """16 kHz waveform ``[1, N]`` (at most 30 s) -> speech tokens int32 ``[1, T']``."""
        if wave16k.dim() == 2 and wave16k.shape[1] / 16000 > MAX_PROMPT_SECONDS:
            raise OnnxModelError(
                f"speech tokenizer input is {wave16k.shape[1] / 16000:.2f} s, the limit is {MAX_PROMPT_SECONDS:g} s"
            )
        return self.tokenize(whisper_log_mel(wave16k))
