"""FunASR recognition (SenseVoiceSmall by default): one model for all sessions.

The model is built once with `funasr.AutoModel` (no update check, no progress
bars) from a local directory, the ModelScope cache, or a download. Requests of
all sessions are batched (`Batcher`) and run in one worker thread. SenseVoice
prefixes its text with language/emotion/event tags (`<|zh|><|NEUTRAL|>...`);
they are removed. Loading is bounded by `asr.load_timeout_s` and checked by a
warm-up recognition, so a broken model stops the process at start-up instead
of failing the first user.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import threading
from collections.abc import Callable
from importlib.util import find_spec
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from gateway.asr.base import ASRBusy, ASRError, ASRInputError, ASRLoadError, ASRModelMissing
from gateway.asr.batcher import Batcher, BatcherClosed, BatcherFull
from gateway.asr.gpu_share import CudaMeter, apply_process_cap, check_share, resolve_device
from gateway.config import ASRConfig, GPUConfig

log = logging.getLogger(__name__)

SAMPLE_RATE = 16000
MIN_SAMPLES = SAMPLE_RATE // 10  # shorter audio is not sent to the model
_TAG = re.compile(r"<\|[^|<>]*\|>")
_SPACES = re.compile(r"\s+")
T = TypeVar("T")


def clean_text(text: str) -> str:
    """Recognised text without SenseVoice's rich tags (language, emotion, event, itn)."""
    return _SPACES.sub(" ", _TAG.sub("", text)).strip()


LOCAL_MODEL_DIR = Path("models/SenseVoiceSmall")  # where scripts/download_model.py puts it
HUB_MODEL_ID = "iic/SenseVoiceSmall"
DOWNLOAD_HINT = "python scripts/download_model.py --only asr"


def model_reference(model: str) -> str:
    """`asr.model` with `auto` resolved: the downloaded local directory when present, else the hub id."""
    if model != "auto":
        return model
    return str(LOCAL_MODEL_DIR) if LOCAL_MODEL_DIR.is_dir() else HUB_MODEL_ID


def modelscope_cache_dirs(model_id: str) -> list[Path]:
    """Where ModelScope keeps a downloaded model (newer and older cache layouts)."""
    root = Path(os.environ.get("MODELSCOPE_CACHE") or Path.home() / ".cache" / "modelscope" / "hub")
    root = root.expanduser()
    return [root / "models" / model_id, root / model_id]


def check_model_dir(path: Path) -> None:
    """Raises `ASRModelMissing` unless `path` holds a FunASR model (config + weights)."""
    if not (path / "config.yaml").is_file():
        raise ASRModelMissing(f"{path} is not a FunASR model directory: config.yaml is missing")
    weights = path / "model.pt"
    meta = path / "configuration.json"
    if meta.is_file():
        try:
            metas = json.loads(meta.read_text(encoding="utf-8")).get("file_path_metas", {})
        except (ValueError, AttributeError) as exc:
            raise ASRModelMissing(f"{meta} is not valid JSON: {exc}") from exc
        if isinstance(metas, dict) and isinstance(metas.get("init_param"), str):
            weights = path / metas["init_param"]
    if not weights.is_file():
        # FunASR itself would only print a line and go on with random weights.
        raise ASRModelMissing(f"{path} has no weights ({weights.name} is missing)")


def _with_timeout(fn: Callable[[], T], timeout_s: float, what: str) -> T:
    """Runs `fn` in a daemon thread; `ASRLoadError` if it takes longer than `timeout_s`."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="asr-load", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise ASRLoadError(f"{what} did not finish within {timeout_s:g} s (asr.load_timeout_s)")
    if "error" in box:
        raise box["error"]
    return box["value"]


class FunASRBackend:
    name = "funasr"

    def __init__(self, model: Any, cfg: ASRConfig, *, device: str = "cpu") -> None:
        """`model` is a built `funasr.AutoModel` (or anything with its `generate`)."""
        self._model = model
        self.cfg = cfg
        self.device = device
        self.memory: dict[str, float] = {}
        self.warning: str | None = None
        self._batcher: Batcher[np.ndarray, str] = Batcher(
            self.recognise_batch,
            max_batch=cfg.max_batch,
            max_queue=cfg.max_queue,
            max_weight=cfg.max_batch_audio_s,
            weight=lambda pcm: pcm.size / SAMPLE_RATE,
            name="asr",
            # torch's intra-op thread count is per thread: this one only affects recognition
            initializer=functools.partial(torch.set_num_threads, cfg.threads) if cfg.threads else None,
        )

    @property
    def stats(self) -> dict[str, float]:
        s = self._batcher.stats
        return {
            "requests": s.requests,
            "batches": s.batches,
            "refused": s.refused,
            "failed_batches": s.failed_batches,
            "max_batch": s.max_batch_seen,
            "busy_s": round(s.busy_s, 3),
            "waiting": self._batcher.waiting,
        }

    # ---- loading -----------------------------------------------------------------

    @staticmethod
    def locate_model(cfg: ASRConfig) -> str:
        """A local directory for `cfg.model`, or its hub id when it may be downloaded."""
        model = model_reference(cfg.model)
        path = Path(model).expanduser()
        if path.is_dir():
            try:
                check_model_dir(path)
            except ASRModelMissing as exc:
                raise ASRModelMissing(f"{exc} (to fetch it again: {DOWNLOAD_HINT})") from exc
            return str(path)
        if path.exists():
            raise ASRModelMissing(f"asr.model {model} is not a directory")
        looked = modelscope_cache_dirs(model)
        for cached in looked:
            if cached.is_dir():
                check_model_dir(cached)
                return str(cached)
        if model.startswith(("/", ".", "~")):
            raise ASRModelMissing(f"no model directory at {path}")
        where = ", ".join(str(p) for p in ([LOCAL_MODEL_DIR] if cfg.model == "auto" else []) + looked)
        if not cfg.download:
            raise ASRModelMissing(
                f"{model} is not downloaded (looked in {where}) and asr.download is off; run {DOWNLOAD_HINT}"
            )
        if find_spec("modelscope") is None:
            raise ASRModelMissing(
                f"{model} is not downloaded (looked in {where}); run {DOWNLOAD_HINT} (into "
                f"{LOCAL_MODEL_DIR}, used by asr.model: auto), `pip install modelscope` to let the "
                "gateway download it at start-up, or set asr.model to a local model directory"
            )
        return model

    @classmethod
    def load(cls, cfg: ASRConfig, gpu: GPUConfig | None = None) -> FunASRBackend:
        """Builds the model, checks it with a warm-up; `ASRLoadError` when that fails."""
        model_ref = cls.locate_model(cfg)
        device = resolve_device(cfg.device)
        apply_process_cap(gpu, device)
        if not Path(model_ref).is_dir():
            log.warning("downloading ASR model %s from ModelScope (once)...", model_ref)
        with CudaMeter(device) as weights:
            model = _with_timeout(lambda: _build(model_ref, device, cfg), cfg.load_timeout_s, "loading ASR")
        backend = cls(model, cfg, device=device)
        backend._warm_up(gpu, weights.use)
        log.info("ASR ready: FunASR %s on %s", model_ref, device)
        return backend

    def _warm_up(self, gpu: GPUConfig | None, weights: Any) -> None:
        try:
            self.recognise_batch([np.zeros(SAMPLE_RATE, np.int16)])
            if not self.device.startswith("cuda"):
                return
            # The largest batch the batcher may form, to measure the ASR's peak memory.
            per = min(self.cfg.max_batch_audio_s / self.cfg.max_batch, 60.0)
            batch = [np.zeros(int(per * SAMPLE_RATE), np.int16)] * self.cfg.max_batch
            with CudaMeter(self.device) as peak:
                self.recognise_batch(batch)
            torch.cuda.empty_cache()
        except Exception as exc:
            raise ASRLoadError(f"the ASR model loaded but cannot recognise: {exc}") from exc
        self.memory = {
            "weights_gib": round(weights.kept_gib, 3),
            "batch_peak_gib": round(peak.use.peak_gib, 3),
        }
        self.warning = check_share(gpu, weights, peak.use)
        if self.warning:
            log.warning("!!! %s", self.warning)

    # ---- recognition -------------------------------------------------------------

    async def transcribe(self, pcm16k: np.ndarray) -> str:
        pcm = _check_pcm(pcm16k)
        if pcm.size < MIN_SAMPLES:
            return ""
        try:
            return await self._batcher.submit(pcm)
        except BatcherFull as exc:
            raise ASRBusy(str(exc)) from exc
        except BatcherClosed as exc:
            raise ASRError(str(exc)) from exc
        except ASRError:
            raise
        except Exception as exc:
            raise ASRError(f"recognition failed: {exc}") from exc

    def recognise_batch(self, pcms: list[np.ndarray]) -> list[str]:
        """Texts of several utterances in one model call (runs in the batcher's thread)."""
        audio = [pcm.astype(np.float32) / 32768.0 for pcm in pcms]
        with torch.inference_mode():
            results = self._model.generate(
                input=audio,
                batch_size=len(audio),
                language=self.cfg.language,
                use_itn=self.cfg.use_itn,
                disable_pbar=True,
            )
        if len(results) != len(audio):
            raise ASRError(f"FunASR returned {len(results)} results for {len(audio)} utterances")
        return [clean_text(str(r.get("text", ""))) for r in results]

    async def aclose(self) -> None:
        await self._batcher.aclose()


def _check_pcm(pcm: np.ndarray) -> np.ndarray:
    if not isinstance(pcm, np.ndarray) or pcm.ndim != 1:
        raise ASRInputError("expected a 1-D numpy array of 16 kHz mono samples")
    if pcm.dtype != np.int16:
        raise ASRInputError(f"expected int16 samples, got {pcm.dtype}")
    return pcm


def _build(model_ref: str, device: str, cfg: ASRConfig) -> Any:
    try:
        from funasr import AutoModel
    except ImportError as exc:
        raise ASRLoadError(f"FunASR is not installed or incomplete ({exc}); run scripts/setup.sh") from exc
    root = logging.getLogger()
    previous = logging.root.manager.disable
    logging.disable(logging.INFO)  # FunASR logs its loading steps on the root logger
    try:
        return AutoModel(
            model=model_ref,
            device=device,
            ncpu=cfg.threads or torch.get_num_threads(),  # FunASR sets it (for this loading thread)
            disable_update=True,
            disable_pbar=True,
            disable_log=True,
            log_level=logging.getLevelName(root.getEffectiveLevel()),
        )
    except Exception as exc:  # FunASR raises whatever its parts raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ASRLoadError(f"FunASR cannot build the model {model_ref}: {first}") from exc
    finally:
        logging.disable(previous)
