"""What works with the configured models: each check's `CheckResult`, and the short form run at start-up.

A check is one `CheckResult` (status ok / missing / failed / skipped, a one-line detail and the exact
fix); a check never raises: its exception becomes a failed result, the traceback kept in `trace` for
`--verbose`. The start-up short form (`tts_file_checks`, `loaded_model_checks`, `asr_status_checks`,
reported by `log_checks`) only does the cheap part: the file checks of the CosyVoice3 directory
(`cosyvoice.tools.model_check`) read checkpoint indexes (mmap), not weights; the ONNX signatures and
the tokenizer are those of the model the server just loaded. `python -m gateway check` loads and tries
everything (gateway/checks/run.py).
"""

from __future__ import annotations

import logging
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cosyvoice.tools import model_check as files
from gateway.config import TTSConfig

log = logging.getLogger(__name__)

OK, MISSING, FAILED, SKIPPED = files.OK, files.MISSING, files.FAILED, files.SKIPPED
TTS_DOWNLOAD = "python scripts/download_model.py --only tts"
ASR_DOWNLOAD = "python scripts/download_model.py --only asr"


@dataclass(slots=True)
class CheckResult:
    name: str
    status: str
    detail: str
    fix: str = ""
    trace: str | None = None  # the traceback of an unexpected exception (shown with --verbose)

    @property
    def failed(self) -> bool:
        return self.status in (MISSING, FAILED)

    def as_dict(self) -> dict[str, str]:
        return {key: value for key, value in asdict(self).items() if key != "trace"}


def one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {first}" if not first or len(first) < 8 else first


def unexpected(name: str, exc: BaseException, fix: str) -> CheckResult:
    return CheckResult(name, FAILED, one_line(exc), fix, traceback.format_exc())


# ------------------------------------------------------------------------------------- TTS files


def _fix_for(finding: files.Finding) -> str:
    if finding.status in (OK, SKIPPED):
        return ""
    return f"{finding.hint or 're-download the model'} ({TTS_DOWNLOAD})"


def tts_file_checks(cfg: TTSConfig, *, onnx: bool = True, tokenizer: bool = True) -> list[CheckResult]:
    """The CosyVoice3 model directory, file by file (nothing is loaded into memory)."""
    model_dir = Path(cfg.model_dir)
    try:
        findings, _ = files.check_model_dir(model_dir, onnx=onnx, tokenizer=tokenizer)
    except Exception as exc:  # noqa: BLE001 - a check reports, it never stops the caller
        return [unexpected("tts model", exc, f"re-download the model ({TTS_DOWNLOAD})")]
    results = []
    for finding in findings:
        detail = finding.detail
        if finding.status == MISSING and finding.name == "model directory":
            detail = f"no CosyVoice3 model at {model_dir}"
        results.append(CheckResult(f"tts {finding.name}", finding.status, detail, _fix_for(finding)))
    return results


def loaded_model_checks(backend: Any) -> list[CheckResult]:
    """ONNX signatures and tokenizer tokens of a loaded CosyVoice backend (as the server loaded them)."""
    model = getattr(backend, "model", None)
    if model is None:
        return []
    model_dir = Path(model.config.files.model_dir)
    results = []
    finding = files.check_tokenizer(
        model_dir, model.tokenizer, endofprompt_id=model.config.llm.endofprompt_id
    )
    results.append(CheckResult(f"tts {finding.name}", finding.status, finding.detail, _fix_for(finding)))
    for file, frontend in (
        ("campplus.onnx", model.campplus),
        ("speech_tokenizer_v3.onnx", model.speech_tokenizer),
    ):
        session = getattr(frontend, "_session", None)  # the session the frontend runs
        if session is None:
            finding = files.Finding(
                file, MISSING, "not loaded: voices cannot be prepared from recordings", "download the model"
            )
        else:
            finding = files.check_onnx_session(file, session)
        results.append(CheckResult(f"tts {file}", finding.status, finding.detail, _fix_for(finding)))
    return results


# ------------------------------------------------------------------------------------ start-up


def asr_status_checks(asr: Any) -> list[CheckResult]:
    """The ASR the server built: loaded, or off and why."""
    if asr.name != "none":
        return [CheckResult("asr model", OK, f"{asr.name} loaded")]
    warning = getattr(asr, "warning", None)
    if warning is None:
        return [CheckResult("asr model", SKIPPED, "asr.backend: none (spoken requests get a notice)")]
    fix = "bash scripts/setup.sh" if "not installed" in warning else ASR_DOWNLOAD
    return [CheckResult("asr model", MISSING, warning, fix)]


def log_checks(results: list[CheckResult], logger: logging.Logger = log) -> None:
    """One summary line, then one line per problem with its fix."""
    problems = [r for r in results if r.failed]
    counts = {status: sum(r.status == status for r in results) for status in (OK, MISSING, FAILED, SKIPPED)}
    summary = ", ".join(f"{n} {status}" for status, n in counts.items() if n)
    if problems:
        logger.warning("model checks: %s (python -m gateway check for details)", summary)
    else:
        logger.info("model checks: %s", summary or "none")
    for result in problems:
        logger.warning("!!! check %s %s: %s; fix: %s", result.name, result.status, result.detail, result.fix)
