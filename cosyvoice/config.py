"""Typed CosyVoice3 configuration built from a model directory.

``load_config(model_dir)`` reads ``cosyvoice3.yaml`` (HyperPyYAML, parsed without executing any tag)
and ``CosyVoice-BlankEN/config.json`` (the Qwen2 backbone geometry) and returns a frozen
:class:`CosyVoice3Config` holding every number the LLM, flow, HiFT and frontend need, including the
constants upstream hard-codes rather than puts in the yaml.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cosyvoice.hyperyaml import HyperYamlError, NodeReader, load_hyperyaml

__all__ = [
    "CFMConfig",
    "ConfigError",
    "CosyVoice3Config",
    "DiTConfig",
    "FeatureConfig",
    "FlowConfig",
    "HiFTConfig",
    "LLMConfig",
    "ModelFiles",
    "SamplingConfig",
    "StreamingConfig",
    "load_config",
]

YAML_NAME = "cosyvoice3.yaml"
BLANK_EN_DIR = "CosyVoice-BlankEN"
LLM_CLASS = "cosyvoice.llm.llm.CosyVoice3LM"
FLOW_CLASS = "cosyvoice.flow.flow.CausalMaskedDiffWithDiT"
HIFT_CLASS = "cosyvoice.hifigan.generator.CausalHiFTGenerator"


class ConfigError(ValueError):
    """A model directory lacks a file, or its config lacks a key or holds a value of the wrong type."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LLMConfig:
    """Qwen2 backbone (from BlankEN ``config.json``) plus the CosyVoice3LM speech vocabulary."""

    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    text_vocab_size: int  # rows of embed_tokens (151936 in the release)
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    speech_token_size: int  # FSQ codes 0..speech_token_size-1 (6561)
    num_speech_special: int = 200  # rows after the codes: sos, eos, task_id, fill, then unused
    mix_ratio: tuple[int, int] = (5, 15)
    endofprompt_id: int = 151646  # hard-coded upstream

    @property
    def speech_vocab_size(self) -> int:
        """Rows of speech_embedding and llm_decoder (6761)."""
        return self.speech_token_size + self.num_speech_special

    @property
    def sos_id(self) -> int:
        return self.speech_token_size

    @property
    def eos_id(self) -> int:
        return self.speech_token_size + 1

    @property
    def task_id(self) -> int:
        return self.speech_token_size + 2

    @property
    def fill_id(self) -> int:
        return self.speech_token_size + 3


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplingConfig:
    """RAS sampling and the text-length based generation limits."""

    top_p: float
    top_k: int
    win_size: int
    tau_r: float
    min_token_text_ratio: float = 2.0  # hard-coded upstream
    max_token_text_ratio: float = 20.0  # hard-coded upstream
    silent_tokens: tuple[int, ...] = (1, 2, 28, 29, 55, 248, 494, 2241, 2242, 2322, 2323)
    max_silent_run: int = 5  # silent tokens beyond this run length never reach the flow


@dataclass(frozen=True, slots=True, kw_only=True)
class DiTConfig:
    dim: int
    depth: int
    heads: int
    dim_head: int
    ff_mult: int
    mel_dim: int
    mu_dim: int
    spk_dim: int
    out_channels: int
    static_chunk_size: int  # mel frames per chunk of the streaming attention mask
    num_decoding_left_chunks: int  # < 0: all left chunks


@dataclass(frozen=True, slots=True, kw_only=True)
class CFMConfig:
    in_channels: int
    n_spks: int
    spk_emb_dim: int
    sigma_min: float
    solver: str
    t_scheduler: str
    training_cfg_rate: float
    inference_cfg_rate: float
    n_timesteps: int = 10  # hard-coded upstream
    noise_seed: int = 0  # the fixed noise buffer: manual_seed(0); randn(1, mel_dim, noise_frames)
    noise_frames: int = 15000


@dataclass(frozen=True, slots=True, kw_only=True)
class FlowConfig:
    input_size: int
    output_size: int
    spk_embed_dim: int
    vocab_size: int
    input_frame_rate: int
    token_mel_ratio: int
    pre_lookahead_len: int
    pre_lookahead_channels: int
    dit: DiTConfig
    cfm: CFMConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class HiFTConfig:
    in_channels: int
    base_channels: int
    nb_harmonics: int
    sampling_rate: int
    nsf_alpha: float
    nsf_sigma: float
    nsf_voiced_threshold: float
    upsample_rates: tuple[int, ...]
    upsample_kernel_sizes: tuple[int, ...]
    istft_n_fft: int
    istft_hop_len: int
    resblock_kernel_sizes: tuple[int, ...]
    resblock_dilation_sizes: tuple[tuple[int, ...], ...]
    source_resblock_kernel_sizes: tuple[int, ...]
    source_resblock_dilation_sizes: tuple[tuple[int, ...], ...]
    lrelu_slope: float
    audio_limit: float
    conv_pre_look_right: int
    f0_num_class: int
    f0_in_channels: int
    f0_cond_channels: int

    @property
    def samples_per_frame(self) -> int:
        """Waveform samples per mel frame (480 at 24 kHz)."""
        total = self.istft_hop_len
        for rate in self.upsample_rates:
            total *= rate
        return total


@dataclass(frozen=True, slots=True, kw_only=True)
class FeatureConfig:
    """The flow prompt mel (``feat_extractor``: matcha mel_spectrogram)."""

    n_fft: int
    num_mels: int
    sampling_rate: int
    hop_size: int
    win_size: int
    fmin: float
    fmax: float | None
    center: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamingConfig:
    chunk_size: int  # tokens per training chunk (25)
    token_hop_len: int = 25  # first hop, before prompt padding
    token_max_hop_len: int = 100
    stream_scale_factor: int = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelFiles:
    """Paths of the files a model directory provides (existence is checked by whoever loads them)."""

    model_dir: Path
    yaml: Path
    llm: Path
    flow: Path
    hift: Path
    campplus: Path
    speech_tokenizer: Path
    blank_en: Path  # holds config.json, vocab.json, merges.txt, tokenizer_config.json


@dataclass(frozen=True, slots=True, kw_only=True)
class CosyVoice3Config:
    sample_rate: int
    token_frame_rate: int
    token_mel_ratio: int
    spk_embed_dim: int
    llm: LLMConfig
    sampling: SamplingConfig
    flow: FlowConfig
    hift: HiFTConfig
    feature: FeatureConfig
    streaming: StreamingConfig
    files: ModelFiles
    raw: Mapping[str, Any] = field(repr=False, compare=False)  # the resolved yaml, tags as Tagged


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: file not found") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: invalid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    return data


def _llm_config(yaml_llm: NodeReader, qwen: NodeReader) -> LLMConfig:
    hidden = qwen.int("hidden_size")
    heads = qwen.int("num_attention_heads")
    if hidden % heads:
        raise ConfigError(
            f"{qwen.source}: hidden_size {hidden} is not a multiple of num_attention_heads {heads}"
        )
    for key in ("llm_input_size", "llm_output_size"):
        if yaml_llm.int(key) != hidden:
            raise ConfigError(
                f"{yaml_llm.source}: llm.{key} = {yaml_llm.int(key)} but {qwen.source} hidden_size = {hidden}"
            )
    mix_ratio = yaml_llm.ints("mix_ratio")
    if len(mix_ratio) != 2:
        raise ConfigError(f"{yaml_llm.source}: 'llm.mix_ratio' must have two entries, got {mix_ratio}")
    return LLMConfig(
        hidden_size=hidden,
        num_layers=qwen.int("num_hidden_layers"),
        num_attention_heads=heads,
        num_key_value_heads=qwen.int("num_key_value_heads"),
        head_dim=qwen.int("head_dim") if "head_dim" in qwen else hidden // heads,
        intermediate_size=qwen.int("intermediate_size"),
        text_vocab_size=qwen.int("vocab_size"),
        rope_theta=qwen.float("rope_theta"),
        rms_norm_eps=qwen.float("rms_norm_eps"),
        max_position_embeddings=qwen.int("max_position_embeddings"),
        speech_token_size=yaml_llm.int("speech_token_size"),
        mix_ratio=(mix_ratio[0], mix_ratio[1]),
    )


def _flow_config(flow: NodeReader) -> FlowConfig:
    lookahead = flow.sub("pre_lookahead_layer", "cosyvoice.transformer.upsample_encoder.PreLookaheadLayer")
    decoder = flow.sub("decoder", "cosyvoice.flow.flow_matching.CausalConditionalCFM")
    cfm_params = decoder.sub("cfm_params")
    if "content" in cfm_params:  # !new:omegaconf.DictConfig {content: {...}}
        cfm_params = cfm_params.sub("content")
    dit = decoder.sub("estimator", "cosyvoice.flow.DiT.dit.DiT")
    pre_lookahead_len = flow.int("pre_lookahead_len")
    if lookahead.int("pre_lookahead_len") != pre_lookahead_len:
        raise ConfigError(f"{flow.source}: flow.pre_lookahead_len differs from pre_lookahead_layer's")
    return FlowConfig(
        input_size=flow.int("input_size"),
        output_size=flow.int("output_size"),
        spk_embed_dim=flow.int("spk_embed_dim"),
        vocab_size=flow.int("vocab_size"),
        input_frame_rate=flow.int("input_frame_rate"),
        token_mel_ratio=flow.int("token_mel_ratio"),
        pre_lookahead_len=pre_lookahead_len,
        pre_lookahead_channels=lookahead.int("channels"),
        dit=DiTConfig(
            **{key: dit.int(key) for key in ("dim", "depth", "heads", "dim_head", "ff_mult", "mel_dim")},
            **{key: dit.int(key) for key in ("mu_dim", "spk_dim", "out_channels", "static_chunk_size")},
            num_decoding_left_chunks=dit.int("num_decoding_left_chunks"),
        ),
        cfm=CFMConfig(
            in_channels=decoder.int("in_channels"),
            n_spks=decoder.int("n_spks"),
            spk_emb_dim=decoder.int("spk_emb_dim"),
            sigma_min=cfm_params.float("sigma_min"),
            solver=cfm_params.str("solver"),
            t_scheduler=cfm_params.str("t_scheduler"),
            training_cfg_rate=cfm_params.float("training_cfg_rate"),
            inference_cfg_rate=cfm_params.float("inference_cfg_rate"),
        ),
    )


def _hift_config(hift: NodeReader) -> HiFTConfig:
    f0 = hift.sub("f0_predictor", "cosyvoice.hifigan.f0_predictor.CausalConvRNNF0Predictor")
    istft = hift.sub("istft_params")
    return HiFTConfig(
        in_channels=hift.int("in_channels"),
        base_channels=hift.int("base_channels"),
        nb_harmonics=hift.int("nb_harmonics"),
        sampling_rate=hift.int("sampling_rate"),
        nsf_alpha=hift.float("nsf_alpha"),
        nsf_sigma=hift.float("nsf_sigma"),
        nsf_voiced_threshold=hift.float("nsf_voiced_threshold"),
        upsample_rates=hift.ints("upsample_rates"),
        upsample_kernel_sizes=hift.ints("upsample_kernel_sizes"),
        istft_n_fft=istft.int("n_fft"),
        istft_hop_len=istft.int("hop_len"),
        resblock_kernel_sizes=hift.ints("resblock_kernel_sizes"),
        resblock_dilation_sizes=hift.int_lists("resblock_dilation_sizes"),
        source_resblock_kernel_sizes=hift.ints("source_resblock_kernel_sizes"),
        source_resblock_dilation_sizes=hift.int_lists("source_resblock_dilation_sizes"),
        lrelu_slope=hift.float("lrelu_slope"),
        audio_limit=hift.float("audio_limit"),
        conv_pre_look_right=hift.int("conv_pre_look_right"),
        f0_num_class=f0.int("num_class"),
        f0_in_channels=f0.int("in_channels"),
        f0_cond_channels=f0.int("cond_channels"),
    )


def _feature_config(feat: NodeReader) -> FeatureConfig:
    return FeatureConfig(
        n_fft=feat.int("n_fft"),
        num_mels=feat.int("num_mels"),
        sampling_rate=feat.int("sampling_rate"),
        hop_size=feat.int("hop_size"),
        win_size=feat.int("win_size"),
        fmin=feat.float("fmin"),
        fmax=feat.optional_float("fmax"),
        center=feat.bool("center"),
    )


def load_config(model_dir: str | Path) -> CosyVoice3Config:
    """Build the typed config of the CosyVoice3 model in ``model_dir``; raise ConfigError on any problem."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ConfigError(f"{model_dir}: model directory not found")
    files = ModelFiles(
        model_dir=model_dir,
        yaml=model_dir / YAML_NAME,
        llm=model_dir / "llm.pt",
        flow=model_dir / "flow.pt",
        hift=model_dir / "hift.pt",
        campplus=model_dir / "campplus.onnx",
        speech_tokenizer=model_dir / "speech_tokenizer_v3.onnx",
        blank_en=model_dir / BLANK_EN_DIR,
    )
    try:
        raw = load_hyperyaml(files.yaml, overrides={"qwen_pretrain_path": str(files.blank_en)})
    except HyperYamlError as exc:
        raise ConfigError(str(exc)) from exc
    qwen_json = files.blank_en / "config.json"
    top = NodeReader(raw, "", files.yaml, ConfigError)
    qwen = NodeReader(_read_json(qwen_json), "", qwen_json, ConfigError)
    llm = top.sub("llm", LLM_CLASS)
    sampling = llm.sub("sampling")
    flow = top.sub("flow", FLOW_CLASS)
    hift = top.sub("hift", HIFT_CLASS)
    token_mel_ratio = top.int("token_mel_ratio")
    feature = _feature_config(top.sub("feat_extractor"))
    config = CosyVoice3Config(
        sample_rate=top.int("sample_rate"),
        token_frame_rate=top.int("token_frame_rate"),
        token_mel_ratio=token_mel_ratio,
        spk_embed_dim=top.int("spk_embed_dim"),
        llm=_llm_config(llm, qwen),
        sampling=SamplingConfig(
            top_p=sampling.float("top_p"),
            top_k=sampling.int("top_k"),
            win_size=sampling.int("win_size"),
            tau_r=sampling.float("tau_r"),
        ),
        flow=_flow_config(flow),
        hift=_hift_config(hift),
        feature=feature,
        streaming=StreamingConfig(chunk_size=top.int("chunk_size")),
        files=files,
        raw=raw,
    )
    if feature.sampling_rate != config.sample_rate or config.hift.sampling_rate != config.sample_rate:
        raise ConfigError(f"{files.yaml}: feat_extractor/hift sampling rates differ from sample_rate")
    if config.hift.samples_per_frame != feature.hop_size:
        raise ConfigError(
            f"{files.yaml}: HiFT produces {config.hift.samples_per_frame} samples per mel frame, "
            f"but the mel hop is {feature.hop_size}"
        )
    return config
