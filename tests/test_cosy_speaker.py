import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from cosyvoice.frontend.features import campplus_fbank, flow_mel, whisper_log_mel
from cosyvoice.frontend.onnx import CampPlus, OnnxModelError, SpeechTokenizerV3
from cosyvoice.frontend.resample import resample
from cosyvoice.frontend.speaker import SpeakerError, SpeakerRecord, prepare_speaker


def onnx_lib():
    """The onnx package builds the tiny test graphs; only the ONNX wrapper tests need it."""
    return pytest.importorskip("onnx", reason="the onnx package (test extra) builds the tiny test graphs")


class CharEncoder:
    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]


def save_model(graph, path: Path) -> Path:
    onnx = onnx_lib()
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def campplus_stand_in(path: Path, weight: torch.Tensor) -> Path:
    """[1, T, 80] -> mean over T -> @ weight [80, 192]."""
    onnx = onnx_lib()
    helper, TensorProto = onnx.helper, onnx.TensorProto
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMean", ["fbank"], ["mean"], axes=[1], keepdims=0),
            helper.make_node("MatMul", ["mean", "w"], ["embedding"]),
        ],
        "campplus",
        [helper.make_tensor_value_info("fbank", TensorProto.FLOAT, [1, "T", 80])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, [1, 192])],
        initializer=[onnx.numpy_helper.from_array(weight.numpy(), "w")],
    )
    return save_model(graph, path)


def tokenizer_stand_in(path: Path, stride: int) -> Path:
    """Token = index of the loudest mel bin of every ``stride``-th frame, shaped [1, 1, T']."""
    onnx = onnx_lib()
    helper, TensorProto = onnx.helper, onnx.TensorProto
    constants = {"starts": [0], "ends": [2**31 - 1], "axes": [2], "steps": [stride]}
    graph = helper.make_graph(
        [
            helper.make_node("Slice", ["feats", "starts", "ends", "axes", "steps"], ["picked"]),
            helper.make_node("ArgMax", ["picked"], ["best"], axis=1, keepdims=1),
            helper.make_node("Cast", ["best"], ["indices"], to=TensorProto.INT32),
            helper.make_node("Identity", ["feats_length"], ["length_out"]),
        ],
        "tokenizer",
        [
            helper.make_tensor_value_info("feats", TensorProto.FLOAT, [1, 128, "T"]),
            helper.make_tensor_value_info("feats_length", TensorProto.INT32, [1]),
        ],
        [
            helper.make_tensor_value_info("indices", TensorProto.INT32, [1, 1, "U"]),
            helper.make_tensor_value_info("length_out", TensorProto.INT32, [1]),
        ],
        initializer=[
            helper.make_tensor(name, TensorProto.INT64, [1], value) for name, value in constants.items()
        ],
    )
    return save_model(graph, path)


def chirp(sample_rate: int, seconds: float, channels: int = 2) -> torch.Tensor:
    t = torch.arange(int(sample_rate * seconds), dtype=torch.float64) / sample_rate
    rows = [0.3 * torch.sin(2 * math.pi * (200 + 400 * c) * t * (1 + t)) for c in range(channels)]
    return torch.stack(rows).float()  # [channels, N]


def test_campplus_wrapper_feeds_fbank_and_returns_embedding(tmp_path: Path) -> None:
    weight = torch.randn(80, 192)
    model = CampPlus(campplus_stand_in(tmp_path / "campplus.onnx", weight))
    fbank = torch.randn(50, 80)
    assert torch.allclose(model.embed(fbank), fbank.mean(dim=0, keepdim=True) @ weight, atol=1e-4)
    wave = chirp(16000, 0.5, channels=1)
    expected = campplus_fbank(wave).mean(dim=0, keepdim=True) @ weight
    assert torch.allclose(model.embed_wave(wave), expected, atol=1e-4)
    with pytest.raises(OnnxModelError, match="expected fbank"):
        model.embed(torch.zeros(2, 5, 80))


def test_speech_tokenizer_wrapper_flattens_int32_tokens(tmp_path: Path) -> None:
    model = SpeechTokenizerV3(tokenizer_stand_in(tmp_path / "tok.onnx", stride=4))
    wave = chirp(16000, 1.0, channels=1)
    log_mel = whisper_log_mel(wave)  # [1, 128, 100]
    tokens = model.tokenize(log_mel)
    assert tokens.dtype == torch.int32 and tokens.shape == (1, 25)
    assert torch.equal(tokens[0], log_mel[0, :, ::4].argmax(dim=0).to(torch.int32))
    assert torch.equal(model.tokenize_wave(wave), tokens)
    with pytest.raises(OnnxModelError, match="limit is 30 s"):
        model.tokenize_wave(torch.zeros(1, 16000 * 31))


def test_missing_or_broken_onnx_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(OnnxModelError, match=r"campplus.onnx: ONNX model file not found"):
        CampPlus(tmp_path / "campplus.onnx")
    (tmp_path / "broken.onnx").write_bytes(b"not a model")
    with pytest.raises(OnnxModelError, match=r"broken.onnx: cannot load"):
        SpeechTokenizerV3(tmp_path / "broken.onnx")


@pytest.mark.parametrize(("stride", "expected_tokens"), [(3, 50), (5, 40)])
def test_prepare_speaker_aligns_tokens_and_mel(tmp_path: Path, stride: int, expected_tokens: int) -> None:
    weight = torch.randn(80, 192)
    campplus = CampPlus(campplus_stand_in(tmp_path / "campplus.onnx", weight))
    tokenizer = SpeechTokenizerV3(tokenizer_stand_in(tmp_path / "tok.onnx", stride=stride))
    wave = chirp(44100, 2.0)  # stereo, 2 s -> 100 flow-mel frames
    record = prepare_speaker(
        wave,
        44100,
        "希望你好。",
        tokenizer=CharEncoder(),
        speech_tokenizer=tokenizer,
        speaker_encoder=campplus,
    )
    mono = wave.mean(dim=0, keepdim=True)
    wave16k = resample(mono, 44100, 16000)
    assert record.prompt_speech_tokens.shape == (expected_tokens,)
    assert torch.equal(record.prompt_speech_tokens, tokenizer.tokenize_wave(wave16k)[0, :expected_tokens])
    assert record.prompt_mel.shape == (2 * expected_tokens, 80)
    # the 24 kHz copy comes straight from the original rate
    assert torch.equal(record.prompt_mel, flow_mel(resample(mono, 44100, 24000))[0, : 2 * expected_tokens])
    assert torch.allclose(record.embedding, campplus.embed_wave(wave16k)[0])
    expected_text = "You are a helpful assistant.<|endofprompt|>希望你好。"
    assert record.prompt_text_tokens.tolist() == CharEncoder().encode(expected_text)
    assert record.prompt_text == "希望你好。"


class FakeTokenizer:
    def tokenize_wave(self, wave16k: torch.Tensor) -> torch.Tensor:
        return torch.zeros(1, wave16k.shape[1] // 640, dtype=torch.int32)


class FakeEncoder:
    def embed_wave(self, wave16k: torch.Tensor) -> torch.Tensor:
        return torch.ones(1, 192)


@pytest.mark.parametrize(
    ("wave", "rate", "message"),
    [
        (torch.zeros(1, 8000), 8000, ">= 16000"),
        (torch.zeros(1, 16000 * 31), 16000, "limit is 30 s"),
        (torch.zeros(1, 100), 16000, "shorter than 0.1 s"),
        (torch.zeros(1, 16000, dtype=torch.int16), 16000, "float tensor"),
        (torch.zeros(2, 2, 16000), 16000, "float tensor"),
    ],
)
def test_prepare_speaker_rejects_bad_audio(wave: torch.Tensor, rate: int, message: str) -> None:
    with pytest.raises(SpeakerError, match=message):
        prepare_speaker(
            wave,
            rate,
            "hi",
            tokenizer=CharEncoder(),
            speech_tokenizer=FakeTokenizer(),
            speaker_encoder=FakeEncoder(),
        )


def make_record(**overrides: object) -> SpeakerRecord:
    fields = {
        "prompt_text_tokens": torch.tensor([1, 2, 3], dtype=torch.int32),
        "prompt_speech_tokens": torch.tensor([7, 8], dtype=torch.int32),
        "prompt_mel": torch.randn(4, 80),
        "embedding": torch.randn(192),
        "prompt_text": "你好",
    }
    return SpeakerRecord(**{**fields, **overrides})


def test_speaker_record_round_trip(tmp_path: Path) -> None:
    record = make_record()
    record.save(tmp_path / "voice.safetensors")
    loaded = SpeakerRecord.load(tmp_path / "voice.safetensors")
    assert loaded.prompt_text == "你好"
    for name in ("prompt_text_tokens", "prompt_speech_tokens", "prompt_mel", "embedding"):
        assert torch.equal(getattr(loaded, name), getattr(record, name))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"prompt_mel": torch.randn(5, 80)}, "expected 2 x 2 speech tokens"),
        ({"prompt_speech_tokens": torch.tensor([7, 8])}, "prompt_speech_tokens must be a 1-d torch.int32"),
        ({"embedding": torch.randn(1, 192)}, "embedding must be a 1-d"),
    ],
)
def test_speaker_record_validates_fields(overrides: dict, message: str) -> None:
    with pytest.raises(SpeakerError, match=message):
        make_record(**overrides)


def test_speaker_record_load_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(SpeakerError, match=r"absent.safetensors: speaker file not found"):
        SpeakerRecord.load(tmp_path / "absent.safetensors")
    save_file({"x": torch.zeros(1)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(SpeakerError, match=r"other.safetensors: not a cosyvoice3-speaker/1 file"):
        SpeakerRecord.load(tmp_path / "other.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"\x00" * 3)
    with pytest.raises(SpeakerError, match=r"junk.safetensors: not a readable speaker file"):
        SpeakerRecord.load(tmp_path / "junk.safetensors")
