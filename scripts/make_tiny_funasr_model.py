"""Writes a tiny SenseVoiceSmall model directory in FunASR's own format.

    python scripts/make_tiny_funasr_model.py /tmp/tiny-sensevoice --says 你好

The directory has the files of the published iic/SenseVoiceSmall
(configuration.json, config.yaml, model.pt, am.mvn and the SentencePiece model
`chn_jpn_yue_eng_ko_spectok.bpe.model`) with the same model classes, but a
2-layer encoder of width 32, so that `funasr.AutoModel` loads and runs it on a
CPU in milliseconds. It lets tests exercise the real FunASR code path without
downloading the real model.

The weights are random except for the CTC output bias, which makes one
vocabulary piece win at every frame: SenseVoice's tag prefix followed by the
text given with `--says` (`<|zh|><|NEUTRAL|><|Speech|><|withitn|>你好`), the
shape of what the real model outputs. So recognition of any audio yields that
known text through FunASR's own feature extraction, encoder, CTC decoding and
tokenizer.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

BPE_FILE = "chn_jpn_yue_eng_ko_spectok.bpe.model"
TAGS = "<|zh|><|NEUTRAL|><|Speech|><|withitn|>"
CORPUS = [
    "今天天气很好，我们去公园散步吧。",
    "你好，请问现在几点了？",
    "The weather is fine today, let us go for a walk.",
    "What time is it now, please?",
    "我想听一首歌，声音大一点。",
]
FEATURE_DIM = 80 * 7  # n_mels x lfr_m, as in SenseVoiceSmall

CONFIG_YAML = """\
encoder: SenseVoiceEncoderSmall
encoder_conf:
    output_size: 32
    attention_heads: 2
    linear_units: 64
    num_blocks: 2
    tp_blocks: 1
    dropout_rate: 0.1
    positional_dropout_rate: 0.1
    attention_dropout_rate: 0.1
    input_layer: pe
    pos_enc_class: SinusoidalPositionEncoder
    normalize_before: true
    kernel_size: 11
    sanm_shfit: 0
    selfattention_layer_type: sanm

model: SenseVoiceSmall
model_conf:
    length_normalized_loss: true
    sos: 1
    eos: 2
    ignore_id: -1

tokenizer: SentencepiecesTokenizer
tokenizer_conf:
  bpemodel: null
  unk_symbol: <unk>
  split_with_space: true

frontend: WavFrontend
frontend_conf:
    fs: 16000
    window: hamming
    n_mels: 80
    frame_length: 25
    frame_shift: 10
    lfr_m: 7
    lfr_n: 6
    cmvn_file: null

dataset: SenseVoiceCTCDataset
dataset_conf:
  batch_type: token
  batch_size: 6000
  sos: ${model_conf.sos}
  eos: ${model_conf.eos}

specaug: SpecAugLFR
specaug_conf:
    apply_time_warp: false
    time_warp_window: 5
    time_warp_mode: bicubic
    apply_freq_mask: true
    freq_mask_width_range: [0, 30]
    lfr_rate: 6
    num_freq_mask: 1
    apply_time_mask: true
    time_mask_width_range: [0, 12]
    num_time_mask: 1
"""

CONFIGURATION = {
    "framework": "pytorch",
    "task": "auto-speech-recognition",
    "model": {"type": "funasr"},
    "pipeline": {"type": "funasr-pipeline"},
    "file_path_metas": {
        "init_param": "model.pt",
        "config": "config.yaml",
        "tokenizer_conf": {"bpemodel": BPE_FILE},
        "frontend_conf": {"cmvn_file": "am.mvn"},
    },
}


def write_bpe(path: Path, piece: str) -> None:
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS * 4),
        model_writer=model,
        model_type="bpe",
        vocab_size=96,
        hard_vocab_limit=False,
        character_coverage=1.0,
        user_defined_symbols=[piece],
        minloglevel=2,
    )
    path.write_bytes(model.getvalue())


def write_cmvn(path: Path, dim: int = FEATURE_DIM) -> None:
    """Kaldi nnet-style global CMVN, the format of SenseVoice's am.mvn."""
    shift = " ".join(["-8.0"] * dim)
    scale = " ".join(["0.25"] * dim)
    path.write_text(
        "<Nnet>\n"
        f"<Splice> {dim} {dim}\n[ 0 ]\n"
        f"<AddShift> {dim} {dim}\n<LearnRateCoef> 0 [ {shift} ]\n"
        f"<Rescale> {dim} {dim}\n<LearnRateCoef> 0 [ {scale} ]\n"
        "</Nnet>\n",
        encoding="utf-8",
    )


def make_tiny_model(out: str | Path, *, says: str = "你好", seed: int = 0) -> Path:
    """Writes the model directory `out` (created if needed) and returns its path."""
    import torch

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    piece = TAGS + says
    write_bpe(out / BPE_FILE, piece)
    write_cmvn(out / "am.mvn")
    (out / "config.yaml").write_text(CONFIG_YAML, encoding="utf-8")
    (out / "configuration.json").write_text(json.dumps(CONFIGURATION, indent=2), encoding="utf-8")
    (out / "model.pt").unlink(missing_ok=True)

    from funasr import AutoModel  # builds the same classes AutoModel will load later

    torch.manual_seed(seed)
    model, kwargs = AutoModel.build_model(
        model=str(out), device="cpu", ncpu=torch.get_num_threads(), disable_update=True
    )
    token = kwargs["tokenizer"].sp.piece_to_id(piece)
    with torch.no_grad():
        model.ctc.ctc_lo.bias.zero_()
        model.ctc.ctc_lo.bias[token] = 50.0
    torch.save(model.state_dict(), out / "model.pt")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="directory to write")
    parser.add_argument("--says", default="你好", help="the text every recognition returns")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    path = make_tiny_model(args.out, says=args.says, seed=args.seed)
    print(f"tiny FunASR model written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
