"""Typed CosyVoice3 configuration built from a model directory.

``load_config(model_dir)`` reads ``cosyvoice3.yaml`` (HyperPyYAML, parsed without executing any tag)
and ``CosyVoice-BlankEN/config.json`` (the Qwen2 backbone geometry) and returns a frozen
:class:`CosyVoice3Config` holding every number the LLM, flow, HiFT and frontend need, including the
constants upstream hard-codes rather than puts in the yaml. Each stage owns its config class
(:class:`~cosyvoice.llm.LLMConfig`, :class:`~cosyvoice.flow.FlowConfig`, :class:`~cosyvoice.hift.HiFTConfig`);
this module reads the yaml into them, and holds what belongs to the model as a whole.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from cosyvoice.files import read_json_object
from cosyvoice.flow.config import CFMConfig, DiTConfig, FlowConfig
from cosyvoice.hift.config import HiFTConfig
from cosyvoice.hyperyaml import HyperYamlError, NodeReader, load_hyperyaml
from cosyvoice.llm.config import LLMConfig, SamplingConfig
from cosyvoice.llm.qwen2 import Qwen2Config

__all__ = ["ConfigError", "CosyVoice3Config", "FeatureConfig", "ModelFiles", "StreamingConfig", "load_config"]

YAML_NAME = "cosyvoice3.yaml"
BLANK_EN_DIR = "CosyVoice-BlankEN"
RL_LLM_NAME = "llm.rl.pt"
T = TypeVar("T")
LLM_CLASS = "cosyvoice.llm.llm.CosyVoice3LM"
FLOW_CLASS = "cosyvoice.flow.flow.CausalMaskedDiffWithDiT"
HIFT_CLASS = "cosyvoice.hifigan.generator.CausalHiFTGenerator"


class ConfigError(ValueError):
    """A model directory lacks a file, or its config lacks a key or holds a value of the wrong type."""


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
    llm_rl: Path  # the optional reinforcement-learned LLM (``use_rl_llm``)


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


def _stage_config(build: Callable[[], T], source: Path) -> T:
    """``build()`` of a stage's config from values already read, the class's own checks (ValueError)
    reported as a ConfigError naming ``source``."""
    try:
        return build()
    except ValueError as exc:
        raise ConfigError(f"{source}: {exc}") from exc


def _qwen2_config(qwen: NodeReader) -> Qwen2Config:
    """The backbone from BlankEN's ``config.json``: every field of :class:`Qwen2Config` is a key there."""
    hidden = qwen.int("hidden_size")
    heads = qwen.int("num_attention_heads")
    if hidden % heads:
        raise ConfigError(
            f"{qwen.source}: hidden_size {hidden} is not a multiple of num_attention_heads {heads}"
        )
    if "head_dim" in qwen and qwen.int("head_dim") * heads != hidden:
        raise ConfigError(
            f"{qwen.source}: head_dim {qwen.int('head_dim')} x {heads} heads != hidden {hidden}"
        )
    types = typing.get_type_hints(Qwen2Config)
    values = {
        f.name: qwen.int(f.name) if types[f.name] is int else qwen.float(f.name)
        for f in dataclasses.fields(Qwen2Config)
    }
    return _stage_config(lambda: Qwen2Config(**values), qwen.source)


def _llm_config(yaml_llm: NodeReader, qwen: NodeReader) -> LLMConfig:
    backbone = _qwen2_config(qwen)
    for key in ("llm_input_size", "llm_output_size"):
        if yaml_llm.int(key) != backbone.hidden_size:
            raise ConfigError(
                f"{yaml_llm.source}: llm.{key} = {yaml_llm.int(key)} but {qwen.source} hidden_size = "
                f"{backbone.hidden_size}"
            )
    mix_ratio = yaml_llm.ints("mix_ratio")
    if len(mix_ratio) != 2:
        raise ConfigError(f"{yaml_llm.source}: 'llm.mix_ratio' must have two entries, got {mix_ratio}")
    return LLMConfig(
        backbone=backbone,
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
    mel_dim = flow.int("input_size")
    if flow.int("output_size") != mel_dim or dit.int("out_channels") != dit.int("mel_dim"):
        raise ConfigError(
            f"{flow.source}: the flow's input_size, output_size and DiT out_channels must be one mel_dim"
        )
    keys = ("dim", "depth", "heads", "dim_head", "mel_dim", "mu_dim", "spk_dim", "static_chunk_size")
    sizes = {key: dit.int(key) for key in (*keys, "num_decoding_left_chunks")}
    ff_dim = sizes["dim"] * dit.int("ff_mult")
    return FlowConfig(
        dit=_stage_config(lambda: DiTConfig(**sizes, ff_dim=ff_dim), flow.source),
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
        vocab_size=flow.int("vocab_size"),
        mel_dim=mel_dim,
        spk_embed_dim=flow.int("spk_embed_dim"),
        pre_lookahead_channels=lookahead.int("channels"),
        pre_lookahead_len=pre_lookahead_len,
        token_mel_ratio=flow.int("token_mel_ratio"),
        input_frame_rate=flow.int("input_frame_rate"),
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
        llm_rl=model_dir / RL_LLM_NAME,
    )
    try:
        raw = load_hyperyaml(files.yaml, overrides={"qwen_pretrain_path": str(files.blank_en)})
    except HyperYamlError as exc:
        raise ConfigError(str(exc)) from exc
    qwen_json = files.blank_en / "config.json"
    top = NodeReader(raw, "", files.yaml, ConfigError)
    qwen = NodeReader(read_json_object(qwen_json, ConfigError), "", qwen_json, ConfigError)
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
