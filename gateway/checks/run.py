"""`python -m gateway check`: every configured model loaded and tried, the way the server loads it.

`run_checks(config)` loads the TTS backend through `tts_choice.create_tts_backend`, the voice presets
through the engine, FunASR through `FunASRBackend.load` and the Silero VAD through `SileroVAD`, after
checking the CosyVoice3 files one by one (gateway/checks/model.py); then it synthesises one sentence and,
when speech recognition is configured, recognises it back. Each step gives `CheckResult`s; a step never
raises (gateway/checks/report.py prints them).
"""

from __future__ import annotations

import asyncio
import difflib
import inspect
import time
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cosyvoice.tools.model_check import is_release_geometry
from gateway.checks.model import (
    ASR_DOWNLOAD,
    FAILED,
    MISSING,
    OK,
    SKIPPED,
    TTS_DOWNLOAD,
    CheckResult,
    one_line,
    tts_file_checks,
    unexpected,
)
from gateway.config import ASRConfig, Config

SENTENCE = "你好，欢迎使用小智语音网关。"
SYNTH_TIMEOUT_S = 300.0
MATCH_RATIO = 0.5  # loose: recognised text this similar to the sentence counts as a match


# ------------------------------------------------------------------------------------------- TTS


@dataclass(slots=True)
class _Context:
    """What later steps need from earlier ones."""

    engine: Any = None
    release_model: bool = False
    audio16k: np.ndarray | None = None
    asr: Any = None


def _tts_backend_checks(config: Config, ctx: _Context) -> list[CheckResult]:
    from gateway.tts_choice import choose_tts_backend, create_tts_backend, set_cpu_threads
    from tts_engine import TTSEngine

    tts = config.tts
    try:
        choice = choose_tts_backend(tts)
    except RuntimeError as exc:
        return [
            CheckResult("tts backend", FAILED, one_line(exc), f"{TTS_DOWNLOAD}, or apt-get install espeak-ng")
        ]
    results: list[CheckResult] = []
    model_dir = Path(tts.model_dir)
    wants_cosyvoice = tts.backend in ("auto", "cosyvoice")
    if choice.backend == "cosyvoice" or (wants_cosyvoice and model_dir.is_dir()):
        results += tts_file_checks(tts)
    elif wants_cosyvoice:
        results.append(
            CheckResult(
                "tts model",
                MISSING,
                f"no CosyVoice3 model at {model_dir}: speaking with espeak-ng",
                f"{TTS_DOWNLOAD} (or set tts.model_dir)",
            )
        )
    if choice.backend == "cosyvoice" and any(r.failed for r in results):
        results.append(CheckResult("tts load", SKIPPED, "fix the model files above first"))
        return results
    started = time.perf_counter()
    try:
        set_cpu_threads(choice.backend, tts.cpu_threads)
        backend = create_tts_backend(choice.backend, tts, config.engine, config.gpu)
    except Exception as exc:  # noqa: BLE001
        fix = (
            f"re-download the model ({TTS_DOWNLOAD})"
            if choice.backend == "cosyvoice"
            else "bash scripts/setup.sh"
        )
        results.append(unexpected("tts load", exc, fix))
        return results
    seconds = time.perf_counter() - started
    device = getattr(backend, "device", "cpu")
    results.append(CheckResult("tts load", OK, f"{choice.backend} on {device} in {seconds:.1f} s"))
    if choice.backend == "cosyvoice":  # (its tokenizer and ONNX sessions were checked from the files)
        ctx.release_model = is_release_geometry(getattr(backend, "model").config)  # noqa: B009 - a CosyVoice backend
    ctx.engine = TTSEngine(
        backend,
        max_pending_requests=tts.max_pending_requests,
        max_buffered_chunks=tts.max_buffered_chunks,
        max_queue_wait_s=None,
    )
    return results


async def _voice_checks(config: Config, ctx: _Context) -> list[CheckResult]:
    from gateway.voices.store import VoiceStore

    engine = ctx.engine
    voices_dir = Path(config.tts.voices_dir)
    if not engine.supports_cloning:
        return [
            CheckResult(
                "voices", SKIPPED, f"{engine.backend_name} has its own voices: {', '.join(engine.voices)}"
            )
        ]
    store = VoiceStore(voices_dir)
    problems: list[str] = []
    stand_ins: list[str] = []
    try:
        presets = store.load()
    except Exception as exc:  # noqa: BLE001
        return [unexpected("voices", exc, f"check the presets in {voices_dir} (voices/README.md)")]
    for preset in presets:
        try:
            await engine.add_voice(preset)
        except Exception as exc:  # noqa: BLE001 - a preset the backend cannot use is skipped by the server
            problems.append(f"{preset.name}: {one_line(exc)}")
            continue
        if preset.prompt_wav is not None and preset.prompt_wav.parent != voices_dir.resolve():
            stand_ins.append(preset.name)  # its recording is missing: an espeak-ng stand-in
    loaded = engine.voices
    wanted = config.tts.voice
    if wanted not in loaded:
        detail = f"the configured voice {wanted!r} is not available (loaded: {', '.join(loaded) or 'none'})"
        if problems:
            detail += f"; {problems[0]}"
        return [
            CheckResult(
                "voices",
                FAILED,
                detail,
                f"add {voices_dir}/{wanted}.yaml with its recording (voices/README.md)",
            )
        ]
    if problems:
        return [
            CheckResult("voices", FAILED, "; ".join(problems), f"fix or remove those presets in {voices_dir}")
        ]
    if stand_ins:
        return [
            CheckResult(
                "voices",
                MISSING,
                f"{', '.join(stand_ins)}: recording missing, cloning an espeak-ng stand-in (robotic)",
                f"{TTS_DOWNLOAD} (fetches {voices_dir}/default.wav), or add the recording",
            )
        ]
    return [CheckResult("voices", OK, f"{len(loaded)} voice(s): {', '.join(loaded)} (tts.voice: {wanted})")]


async def _synthesis_check(config: Config, ctx: _Context) -> CheckResult:
    engine = ctx.engine
    started = time.perf_counter()
    chunks: list[np.ndarray] = []
    try:
        async with asyncio.timeout(SYNTH_TIMEOUT_S):
            stream = engine.synthesize(SENTENCE, voice=config.tts.voice, output_rate=16000)
            async for chunk in stream:
                chunks.append(np.asarray(chunk, dtype=np.int16))
    except TimeoutError:
        return CheckResult(
            "tts synthesis",
            FAILED,
            f"no complete audio within {SYNTH_TIMEOUT_S:g} s",
            "run on a GPU (tts.device)",
        )
    except Exception as exc:  # noqa: BLE001
        return unexpected("tts synthesis", exc, "see the failed checks above; --verbose shows the traceback")
    seconds = time.perf_counter() - started
    audio = np.concatenate(chunks) if chunks else np.zeros(0, np.int16)
    if audio.size == 0 or not np.any(audio):
        return CheckResult(
            "tts synthesis", FAILED, "the sentence gave no audio (silence)", "re-download the model"
        )
    ctx.audio16k = audio
    duration = audio.size / 16000
    return CheckResult(
        "tts synthesis",
        OK,
        f"{duration:.1f} s of audio in {seconds:.1f} s (real-time factor {seconds / duration:.2f})",
    )


# ------------------------------------------------------------------------------------------- ASR


def _vad_check() -> CheckResult:
    from gateway.asr.vad import SileroVAD, VADUnavailable

    try:
        SileroVAD.shared()
    except VADUnavailable as exc:
        return CheckResult("asr vad", MISSING, one_line(exc), "pip install --no-deps silero-vad")
    except Exception as exc:  # noqa: BLE001
        return unexpected("asr vad", exc, "pip install --force-reinstall --no-deps silero-vad")
    return CheckResult("asr vad", OK, "Silero VAD loaded")


def _asr_fix(cfg: ASRConfig) -> str:
    return f"{ASR_DOWNLOAD} (or set asr.model to a SenseVoiceSmall directory)"


def _asr_load_check(config: Config, ctx: _Context) -> CheckResult:
    from gateway.asr import ASRLoadError, ASRModelMissing, funasr_installed

    cfg = config.asr
    if cfg.backend == "none":
        return CheckResult("asr model", SKIPPED, "asr.backend: none (spoken requests get a notice)")
    if not funasr_installed():
        return CheckResult("asr model", MISSING, "FunASR is not installed", "bash scripts/setup.sh")
    from gateway.asr.funasr_backend import FunASRBackend

    try:
        where = FunASRBackend.locate_model(cfg)
    except ASRModelMissing as exc:
        return CheckResult("asr model", MISSING, one_line(exc), _asr_fix(cfg))
    started = time.perf_counter()
    try:
        ctx.asr = FunASRBackend.load(cfg, config.gpu)
    except ASRLoadError as exc:
        return CheckResult("asr model", FAILED, one_line(exc), f"re-download it: {_asr_fix(cfg)}")
    except Exception as exc:  # noqa: BLE001
        return unexpected("asr model", exc, f"re-download it: {_asr_fix(cfg)}")
    seconds = time.perf_counter() - started
    return CheckResult("asr model", OK, f"FunASR {where} on {ctx.asr.device} in {seconds:.1f} s")


def _normalised(text: str) -> str:
    return "".join(ch for ch in unicodedata.normalize("NFKC", text).lower() if ch.isalnum())


async def _round_trip_check(ctx: _Context) -> CheckResult:
    name = "speech round trip"
    if ctx.audio16k is None:
        return CheckResult(name, SKIPPED, "no synthesised audio to recognise")
    try:
        texts = await asyncio.to_thread(ctx.asr.recognise_batch, [ctx.audio16k])
    except Exception as exc:  # noqa: BLE001
        return unexpected(name, exc, "see asr model above; --verbose shows the traceback")
    text = texts[0] if texts else ""
    ratio = difflib.SequenceMatcher(None, _normalised(SENTENCE), _normalised(text)).ratio()
    said = f"said {SENTENCE!r}, recognised {text!r}"
    if not ctx.release_model:
        return CheckResult(name, OK, f"ran: {said} (not a released TTS model: text not compared)")
    if ratio < MATCH_RATIO:
        return CheckResult(
            name,
            FAILED,
            f"{said} ({ratio:.0%} alike)",
            "the voice prompt or a model file is wrong: check voices/ and re-download the models",
        )
    return CheckResult(name, OK, f"{said} ({ratio:.0%} alike)")


# ----------------------------------------------------------------------------------------- all


async def _step(results: list[CheckResult], name: str, fn: Callable[[], Any]) -> None:
    """Run one step (sync, or async); its results are appended, an exception becomes a failed result."""
    try:
        outcome = fn()
        if inspect.isawaitable(outcome):
            outcome = await outcome
    except Exception as exc:  # noqa: BLE001 - the last line of defence: never a stack trace
        outcome = unexpected(name, exc, "--verbose shows the traceback")
    results.extend(outcome if isinstance(outcome, list) else [outcome])


async def run_checks(config: Config, *, synth: bool = True) -> list[CheckResult]:
    """Every check, in order; see the module docstring."""
    results: list[CheckResult] = []
    ctx = _Context()
    try:
        await _step(results, "tts load", lambda: _tts_backend_checks(config, ctx))
        if ctx.engine is not None:
            await ctx.engine.start()
            await _step(results, "voices", lambda: _voice_checks(config, ctx))
            if synth and config.tts.voice in ctx.engine.voices:
                await _step(results, "tts synthesis", lambda: _synthesis_check(config, ctx))
            elif not synth:
                results.append(CheckResult("tts synthesis", SKIPPED, "--no-synth"))
        else:
            results.append(CheckResult("tts synthesis", SKIPPED, "no TTS model loaded"))
        await _step(results, "asr vad", _vad_check)
        await _step(results, "asr model", lambda: _asr_load_check(config, ctx))
        if ctx.asr is not None and synth:
            await _step(results, "speech round trip", lambda: _round_trip_check(ctx))
    finally:
        if ctx.engine is not None:
            await ctx.engine.close()
        if ctx.asr is not None:
            await ctx.asr.aclose()
    return results
