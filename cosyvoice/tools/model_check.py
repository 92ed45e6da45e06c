"""Check a CosyVoice3 model directory file by file, without loading the weights into modules.

``check_model_dir(model_dir)`` returns one :class:`Finding` per check: the file set, ``cosyvoice3.yaml``
(parsed by our config loader, plus the classes of the model sections), the tokenizer's special tokens,
each checkpoint (readable, plausible size, keys and shapes against what our modules expect for this
yaml, with the closest expected key named for a renamed one) and the two ONNX frontend models (input
names, ranks and types, output ranks). Checkpoints are opened with ``mmap=True``, so only their index
is read: cheap enough to run at every start-up. Nothing here raises for a bad file; every problem
becomes a one-line ``detail`` plus a ``hint`` that says what to do about it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cosyvoice.config import BLANK_EN_DIR, YAML_NAME, ConfigError, CosyVoice3Config, load_config
from cosyvoice.hyperyaml import Tagged
from cosyvoice.tools.check_finding import (
    FAILED,
    MISSING,
    NOT_A_RELEASE,
    OK,
    SKIPPED,
    Finding,
    first_sentence,
    human_size,
    listed,
)
from cosyvoice.tools.checkpoint_check import check_checkpoint, expected_checkpoint_shapes

__all__ = [
    "FAILED",
    "MISSING",
    "OK",
    "SKIPPED",
    "Finding",
    "check_model_dir",
    "check_onnx_session",
    "check_tokenizer",
    "expected_checkpoint_shapes",
    "human_size",
    "is_release_geometry",
]

REDOWNLOAD = "re-download it"

# What the loader needs (campplus / speech tokenizer: for preparing voices from recordings).
REQUIRED_FILES = (
    YAML_NAME,
    "llm.pt",
    "flow.pt",
    "hift.pt",
    "campplus.onnx",
    "speech_tokenizer_v3.onnx",
    f"{BLANK_EN_DIR}/config.json",
    f"{BLANK_EN_DIR}/vocab.json",
    f"{BLANK_EN_DIR}/merges.txt",
)
OPTIONAL_FILES = (f"{BLANK_EN_DIR}/tokenizer_config.json",)

# Classes of the model sections our config loader interprets (cosyvoice3.yaml of the release).
KNOWN_CLASSES = frozenset(
    {
        "cosyvoice.llm.llm.CosyVoice3LM",
        "cosyvoice.llm.llm.Qwen2Encoder",
        "cosyvoice.utils.common.ras_sampling",
        "cosyvoice.flow.flow.CausalMaskedDiffWithDiT",
        "cosyvoice.transformer.upsample_encoder.PreLookaheadLayer",
        "cosyvoice.flow.flow_matching.CausalConditionalCFM",
        "omegaconf.DictConfig",
        "cosyvoice.flow.DiT.dit.DiT",
        "cosyvoice.hifigan.generator.CausalHiFTGenerator",
        "cosyvoice.hifigan.f0_predictor.CausalConvRNNF0Predictor",
        "matcha.utils.audio.mel_spectrogram",
    }
)
MODEL_SECTIONS = ("llm", "flow", "hift", "feat_extractor")


# ----------------------------------------------------------------------------------------- files


def check_files(model_dir: Path) -> Finding:
    missing = [name for name in REQUIRED_FILES if not (model_dir / name).is_file()]
    if missing:
        return Finding(
            "files",
            MISSING,
            f"{len(missing)} of {len(REQUIRED_FILES)} files missing: {listed(missing)}",
            "download the model",
            missing[0],
        )
    extra = [name for name in OPTIONAL_FILES if not (model_dir / name).is_file()]
    note = f" ({listed(extra)} absent, optional)" if extra else ""
    return Finding("files", OK, f"all {len(REQUIRED_FILES)} files present{note}")


# ------------------------------------------------------------------------------------------ yaml


def _tagged_nodes(value: Any, where: str) -> Iterator[tuple[str, Tagged]]:
    if isinstance(value, Tagged):
        yield where, value
        value = value.args
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield from _tagged_nodes(item, f"{where}.{key}")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from _tagged_nodes(item, f"{where}[{index}]")


def check_yaml(model_dir: Path) -> tuple[Finding, CosyVoice3Config | None]:
    yaml_path = model_dir / YAML_NAME
    if not yaml_path.is_file():
        return Finding(YAML_NAME, SKIPPED, "file missing (see files)", file=YAML_NAME), None
    try:
        config = load_config(model_dir)
    except ConfigError as exc:
        message = str(exc).replace(f"{yaml_path}: ", "")
        hint = f"{REDOWNLOAD}; if it persists, {NOT_A_RELEASE}" if "must be !new:" in message else REDOWNLOAD
        return Finding(YAML_NAME, FAILED, message, hint, YAML_NAME), None
    unknown = sorted(
        f"{where} !{node.kind}:{node.target}"
        for section in MODEL_SECTIONS
        for where, node in _tagged_nodes(config.raw.get(section), section)
        if node.target not in KNOWN_CLASSES
    )
    if unknown:
        return (
            Finding(YAML_NAME, FAILED, f"unknown class {listed(unknown)}", f"{NOT_A_RELEASE}", YAML_NAME),
            None,
        )
    llm = config.llm
    return (
        Finding(
            YAML_NAME,
            OK,
            f"classes known; LLM hidden {llm.hidden_size} x {llm.num_layers} layers, "
            f"DiT {config.flow.dit.dim} x {config.flow.dit.depth}, {config.sample_rate} Hz",
        ),
        config,
    )


# ------------------------------------------------------------------------------------- tokenizer


def check_tokenizer(model_dir: Path, tokenizer: Any = None, *, endofprompt_id: int = 151646) -> Finding:
    """The special tokens our text frontend needs, ``<|endofprompt|>`` at the id the LLM expects."""
    from cosyvoice.text.tokenizer import (
        COSYVOICE3_ADDED_TOKENS,
        ENDOFPROMPT,
        ENDOFTEXT,
        CosyVoice3Tokenizer,
        TokenizerError,
    )

    name = "tokenizer"
    blank_en = model_dir / BLANK_EN_DIR
    if tokenizer is None:
        if not (blank_en / "vocab.json").is_file() or not (blank_en / "merges.txt").is_file():
            return Finding(name, SKIPPED, "vocab.json / merges.txt missing (see files)")
        declared = _declared_specials(blank_en / "tokenizer_config.json")
        if declared is not None and ENDOFPROMPT not in declared.values():
            cosy = [token for token in declared.values() if token in COSYVOICE3_ADDED_TOKENS[3:]]
            if cosy:  # it declares CosyVoice tokens, but not the prompt separator
                where = f"id {endofprompt_id} is {declared.get(endofprompt_id)!r}"
                return Finding(
                    name,
                    FAILED,
                    f"{BLANK_EN_DIR}/tokenizer_config.json lacks {ENDOFPROMPT} ({where})",
                    f"re-download {BLANK_EN_DIR}/tokenizer_config.json; if it persists, {NOT_A_RELEASE}",
                    f"{BLANK_EN_DIR}/tokenizer_config.json",
                )
        try:
            tokenizer = CosyVoice3Tokenizer.from_dir(blank_en)
        except (TokenizerError, OSError, ValueError) as exc:
            return Finding(name, FAILED, _short(exc, model_dir), f"re-download {BLANK_EN_DIR}", BLANK_EN_DIR)
    problems = []
    for token in (ENDOFTEXT, ENDOFPROMPT):
        try:
            ids = tokenizer.encode(token)
        except TokenizerError as exc:
            problems.append(f"{token}: {exc}")
            continue
        if len(ids) != 1:
            problems.append(f"{token} is not a single token (ids {ids[:4]})")
    if not problems and tokenizer.endofprompt_id != endofprompt_id:
        problems.append(
            f"{ENDOFPROMPT} has id {tokenizer.endofprompt_id}, the LLM expects {endofprompt_id} "
            f"(vocab.json has {tokenizer.base_vocab_size} regular entries)"
        )
    if problems:
        return Finding(
            name, FAILED, "; ".join(problems), f"re-download {BLANK_EN_DIR}; {NOT_A_RELEASE}", BLANK_EN_DIR
        )
    return Finding(name, OK, f"{len(tokenizer)} tokens; {ENDOFPROMPT} = {tokenizer.endofprompt_id}")


def _declared_specials(path: Path) -> dict[int, str] | None:
    import json

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        added = data.get("added_tokens_decoder", {})
        return {int(key): str(entry["content"]) for key, entry in added.items()}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None  # absent or unreadable: the tokenizer loader reports it


# ------------------------------------------------------------------------------------------ ONNX


@dataclass(frozen=True, slots=True)
class OnnxInput:
    name: str
    rank: int
    type: str  # onnxruntime's "tensor(float)" etc.
    fixed: dict[int, int]  # axis -> size for the axes that must have that size when fixed


ONNX_SIGNATURES: dict[str, tuple[tuple[OnnxInput, ...], tuple[tuple[int, ...], dict[int, int]]]] = {
    # file: (inputs in order, (allowed output-0 ranks, fixed output axes))
    "campplus.onnx": ((OnnxInput("input", 3, "tensor(float)", {2: 80}),), ((2,), {1: 192})),
    "speech_tokenizer_v3.onnx": (
        (
            OnnxInput("feats", 3, "tensor(float)", {1: 128}),
            OnnxInput("feats_length", 1, "tensor(int32)", {}),
        ),
        ((2, 3), {}),
    ),
}


def _describe(arg: Any) -> str:
    dims = ", ".join(str(d) if isinstance(d, int) else "?" for d in (arg.shape or []))
    return f"{arg.name!r} {arg.type} [{dims}]"


def check_onnx_session(file: str, session: Any) -> Finding:
    """Input names, ranks and types and the first output's rank of a loaded ``InferenceSession``."""
    inputs_expected, (output_ranks, output_fixed) = ONNX_SIGNATURES[file]
    inputs, outputs = session.get_inputs(), session.get_outputs()
    hint = f"re-download {file}; if it persists, {NOT_A_RELEASE}"
    if len(inputs) != len(inputs_expected):
        names = ", ".join(e.name for e in inputs_expected)
        got = ", ".join(_describe(i) for i in inputs) or "none"
        return Finding(file, FAILED, f"has {len(inputs)} inputs ({got}), expected {names}", hint, file)
    for index, (arg, want) in enumerate(zip(inputs, inputs_expected, strict=True)):
        shape = list(arg.shape or [])
        problem = None
        if arg.name != want.name:
            problem = f"input {index} is named {arg.name!r}, expected {want.name!r}"
        elif len(shape) != want.rank:
            problem = f"input {want.name!r} has rank {len(shape)} ({_describe(arg)}), expected {want.rank}"
        elif arg.type != want.type:
            problem = f"input {want.name!r} is {arg.type}, expected {want.type}"
        else:
            for axis, size in want.fixed.items():
                if isinstance(shape[axis], int) and shape[axis] != size:
                    problem = f"input {want.name!r} axis {axis} is {shape[axis]}, expected {size}"
        if problem:
            return Finding(file, FAILED, problem, hint, file)
    if not outputs:
        return Finding(file, FAILED, "has no output", hint, file)
    out_shape = list(outputs[0].shape or [])
    if len(out_shape) not in output_ranks:
        return Finding(
            file,
            FAILED,
            f"output {_describe(outputs[0])} has rank {len(out_shape)}, expected {output_ranks[0]}",
            hint,
            file,
        )
    for axis, size in output_fixed.items():
        if isinstance(out_shape[axis], int) and out_shape[axis] != size:
            return Finding(
                file, FAILED, f"output axis {axis} is {out_shape[axis]}, expected {size}", hint, file
            )
    described = "; ".join(_describe(i) for i in inputs)
    return Finding(file, OK, f"inputs {described} -> {_describe(outputs[0])}")


def check_onnx_file(model_dir: Path, file: str) -> Finding:
    import onnxruntime as ort

    path = model_dir / file
    if not path.is_file():
        return Finding(file, SKIPPED, "file missing (see files)", file=file)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3  # onnxruntime's own warnings would clutter the report
    try:
        session = ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own types for bad graphs
        size = path.stat().st_size
        return Finding(
            file,
            FAILED,
            f"onnxruntime cannot load it ({first_sentence(exc)}); it is {human_size(size)}",
            f"re-download {file}: it is truncated or corrupt",
            file,
        )
    return check_onnx_session(file, session)


# ------------------------------------------------------------------------------------------ all


def _short(exc: BaseException, model_dir: Path) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text.replace(f"{model_dir}/", "")


def check_model_dir(
    model_dir: str | Path, *, onnx: bool = True, tokenizer: bool = True
) -> tuple[list[Finding], CosyVoice3Config | None]:
    """Every file check of ``model_dir`` and its config (None when the yaml failed).

    ``onnx=False`` / ``tokenizer=False`` leave those checks to the caller (the server checks the
    sessions and the tokenizer it loaded itself, rather than opening them twice).
    """
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        return [
            Finding("model directory", MISSING, f"{model_dir} does not exist", "download the model")
        ], None
    findings: list[Finding] = []
    config: CosyVoice3Config | None = None

    def guarded(name: str, check: Callable[[], Finding]) -> None:
        try:
            findings.append(check())
        except Exception as exc:  # noqa: BLE001 - a check never raises; the report names the file
            findings.append(Finding(name, FAILED, _short(exc, model_dir), REDOWNLOAD, name))

    guarded("files", lambda: check_files(model_dir))
    try:
        yaml_finding, config = check_yaml(model_dir)
    except Exception as exc:  # noqa: BLE001
        yaml_finding = Finding(YAML_NAME, FAILED, _short(exc, model_dir), REDOWNLOAD, YAML_NAME)
    findings.append(yaml_finding)
    if tokenizer:
        endofprompt = config.llm.endofprompt_id if config is not None else 151646
        guarded("tokenizer", lambda: check_tokenizer(model_dir, endofprompt_id=endofprompt))
    for file in ("llm.pt", "flow.pt", "hift.pt"):
        guarded(file, lambda file=file: check_checkpoint(model_dir, file, config))
    if onnx:
        for file in ONNX_SIGNATURES:
            guarded(file, lambda file=file: check_onnx_file(model_dir, file))
    return findings, config


def is_release_geometry(config: CosyVoice3Config) -> bool:
    """True for the dimensions of Fun-CosyVoice3-0.5B-2512 (as opposed to a tiny test model)."""
    return (config.llm.hidden_size, config.llm.num_layers, config.flow.dit.dim) == (896, 24, 1024)
