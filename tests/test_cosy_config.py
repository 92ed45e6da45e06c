import json
from pathlib import Path

import pytest

from cosyvoice.config import ConfigError, load_config

YAML = """
__set_seed1: !apply:random.seed [1986]
__set_seed3: !apply:torch.manual_seed [1986]
sample_rate: 24000
llm_input_size: 32
llm_output_size: 32
spk_embed_dim: 192
qwen_pretrain_path: ''
token_frame_rate: 25
token_mel_ratio: 2
chunk_size: CHUNK
num_decoding_left_chunks: -1
llm: !new:cosyvoice.llm.llm.CosyVoice3LM
    llm_input_size: !ref <llm_input_size>
    llm_output_size: !ref <llm_output_size>
    speech_token_size: 6561
    mix_ratio: [5, 15]
    llm: !new:cosyvoice.llm.llm.Qwen2Encoder
        pretrain_path: !ref <qwen_pretrain_path>
    sampling: !name:cosyvoice.utils.common.ras_sampling
        top_p: 0.8
        top_k: 25
        win_size: 10
        tau_r: 0.1
flow: !new:FLOW_CLASS
    input_size: 80
    output_size: 80
    spk_embed_dim: !ref <spk_embed_dim>
    vocab_size: 6561
    input_frame_rate: !ref <token_frame_rate>
    token_mel_ratio: !ref <token_mel_ratio>
    pre_lookahead_len: 3
    pre_lookahead_layer: !new:cosyvoice.transformer.upsample_encoder.PreLookaheadLayer
        in_channels: 80
        channels: 64
        pre_lookahead_len: 3
    decoder: !new:cosyvoice.flow.flow_matching.CausalConditionalCFM
        in_channels: 240
        n_spks: 1
        spk_emb_dim: 80
        cfm_params: !new:omegaconf.DictConfig
            content:
                sigma_min: 1e-06
                solver: 'euler'
                t_scheduler: 'cosine'
                training_cfg_rate: 0.2
                inference_cfg_rate: 0.7
        estimator: !new:cosyvoice.flow.DiT.dit.DiT
            dim: 64
            depth: 2
            heads: 4
            dim_head: 16
            ff_mult: 2
            mel_dim: 80
            mu_dim: 80
            spk_dim: 80
            out_channels: 80
            static_chunk_size: !ref <chunk_size> * <token_mel_ratio>
            num_decoding_left_chunks: !ref <num_decoding_left_chunks>
hift: !new:cosyvoice.hifigan.generator.CausalHiFTGenerator
    in_channels: 80
    base_channels: 32
    nb_harmonics: 8
    sampling_rate: !ref <sample_rate>
    nsf_alpha: 0.1
    nsf_sigma: 0.003
    nsf_voiced_threshold: 10
    upsample_rates: [8, 5, 3]
    upsample_kernel_sizes: [16, 11, 7]
    istft_params:
        n_fft: 16
        hop_len: 4
    resblock_kernel_sizes: [3, 7, 11]
    resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    source_resblock_kernel_sizes: [7, 7, 11]
    source_resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    lrelu_slope: 0.1
    audio_limit: 0.99
    conv_pre_look_right: 4
    f0_predictor: !new:cosyvoice.hifigan.f0_predictor.CausalConvRNNF0Predictor
        num_class: 1
        in_channels: 80
        cond_channels: 32
get_tokenizer: !name:cosyvoice.tokenizer.tokenizer.get_qwen_tokenizer
    token_path: !ref <qwen_pretrain_path>
    skip_special_tokens: True
    version: cosyvoice3
feat_extractor: !name:matcha.utils.audio.mel_spectrogram
    n_fft: 1920
    num_mels: 80
    sampling_rate: !ref <sample_rate>
    hop_size: 480
    win_size: 1920
    fmin: 0
    fmax: null
    center: False
"""

QWEN = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "max_position_embeddings": 32768,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "vocab_size": 151936,
}

FLOW_CLASS = "cosyvoice.flow.flow.CausalMaskedDiffWithDiT"


def make_model_dir(
    root: Path, *, chunk: int = 25, flow_class: str = FLOW_CLASS, qwen: dict | None = None
) -> Path:
    (root / "CosyVoice-BlankEN").mkdir(parents=True)
    yaml_text = YAML.replace("CHUNK", str(chunk)).replace("FLOW_CLASS", flow_class)
    (root / "cosyvoice3.yaml").write_text(yaml_text, encoding="utf-8")
    (root / "CosyVoice-BlankEN" / "config.json").write_text(json.dumps(qwen or QWEN), encoding="utf-8")
    return root


def test_load_config_reads_yaml_and_qwen_geometry(tmp_path: Path) -> None:
    config = load_config(make_model_dir(tmp_path))
    assert (config.sample_rate, config.token_frame_rate, config.token_mel_ratio) == (24000, 25, 2)
    llm = config.llm
    assert (llm.hidden_size, llm.num_layers, llm.num_attention_heads, llm.num_key_value_heads) == (
        32,
        2,
        4,
        2,
    )
    assert llm.head_dim == 8 and llm.intermediate_size == 64 and llm.rope_theta == 1e6
    assert llm.speech_vocab_size == 6761
    assert (llm.sos_id, llm.eos_id, llm.task_id, llm.fill_id) == (6561, 6562, 6563, 6564)
    assert config.sampling.top_k == 25 and config.sampling.top_p == 0.8 and config.sampling.win_size == 10
    assert config.sampling.tau_r == 0.1
    flow = config.flow
    assert (flow.pre_lookahead_len, flow.pre_lookahead_channels, flow.vocab_size) == (3, 64, 6561)
    assert flow.dit.static_chunk_size == 50 and flow.dit.num_decoding_left_chunks == -1
    assert (
        flow.cfm.inference_cfg_rate == 0.7 and flow.cfm.sigma_min == 1e-6 and flow.cfm.t_scheduler == "cosine"
    )
    hift = config.hift
    assert hift.upsample_rates == (8, 5, 3) and hift.samples_per_frame == 480
    assert hift.resblock_dilation_sizes == ((1, 3, 5),) * 3 and hift.f0_cond_channels == 32
    assert config.feature.fmax is None and config.feature.n_fft == 1920 and config.feature.center is False
    assert config.files.blank_en == tmp_path / "CosyVoice-BlankEN"
    assert config.files.llm == tmp_path / "llm.pt"


def test_static_chunk_follows_the_ref_arithmetic(tmp_path: Path) -> None:
    config = load_config(make_model_dir(tmp_path, chunk=40))
    assert config.streaming.chunk_size == 40
    assert config.flow.dit.static_chunk_size == 80


def test_tokenizer_path_is_overridden_to_blank_en(tmp_path: Path) -> None:
    config = load_config(make_model_dir(tmp_path))
    tokenizer_node = config.raw["get_tokenizer"]
    assert tokenizer_node.args["token_path"] == str(tmp_path / "CosyVoice-BlankEN")


def test_missing_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="model directory not found"):
        load_config(tmp_path / "absent")
    model_dir = make_model_dir(tmp_path / "a")
    (model_dir / "CosyVoice-BlankEN" / "config.json").unlink()
    with pytest.raises(ConfigError, match=r"CosyVoice-BlankEN/config.json: file not found"):
        load_config(model_dir)
    (model_dir / "cosyvoice3.yaml").unlink()
    with pytest.raises(ConfigError, match=r"cosyvoice3.yaml: file not found"):
        load_config(model_dir)


def test_wrong_model_class_is_rejected(tmp_path: Path) -> None:
    model_dir = make_model_dir(tmp_path, flow_class="cosyvoice.flow.flow.CausalMaskedDiffWithXvec")
    with pytest.raises(ConfigError, match=r"'flow' must be !new:cosyvoice.flow.flow.CausalMaskedDiffWithDiT"):
        load_config(model_dir)


def test_missing_or_mistyped_keys_name_the_key(tmp_path: Path) -> None:
    qwen = {key: value for key, value in QWEN.items() if key != "num_key_value_heads"}
    with pytest.raises(ConfigError, match=r"config.json: missing key 'num_key_value_heads'"):
        load_config(make_model_dir(tmp_path / "a", qwen=qwen))
    model_dir = make_model_dir(tmp_path / "b")
    text = (model_dir / "cosyvoice3.yaml").read_text().replace("top_k: 25", "top_k: many")
    (model_dir / "cosyvoice3.yaml").write_text(text)
    with pytest.raises(ConfigError, match=r"'llm.sampling.top_k' must be an integer"):
        load_config(model_dir)


def test_llm_size_must_match_backbone(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="llm_input_size"):
        load_config(make_model_dir(tmp_path, qwen={**QWEN, "hidden_size": 48}))
