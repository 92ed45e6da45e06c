"""End-to-end tests of the CosyVoice3 facade on a generated random-weight model directory."""

from __future__ import annotations

import math
import shutil
import subprocess
import wave
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from cosyvoice.frontend.speaker import SpeakerError, SpeakerRecord
from cosyvoice.llm import LLMRequest, generate
from cosyvoice.model import CosyVoice3, ModelFilesError
from cosyvoice.text.prompt import TextError
from scripts.make_tiny_model import make_model_dir

SAMPLES_PER_TOKEN = 960  # 2 mel frames x 480 samples at 24 kHz
TRANSCRIPT = "Hello, this is my voice for the test."
TEXT = "The quick brown fox jumps over the lazy dog."  # ~10 tokens -> up to 200 speech tokens
# Tolerance of the official token2wav parity cases (fp32 CPU): the facade must reproduce the direct
# composition of its parts at least that closely.
WAVE_TOL = {"atol": 5e-4, "rtol": 1e-4}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("cosy") / "model", preset="tiny", seed=0, rl_llm=True)


@pytest.fixture(scope="module")
def model(model_dir: Path) -> CosyVoice3:
    return CosyVoice3.from_pretrained(model_dir, max_seconds=30)


def prompt_recording(path: Path) -> tuple[torch.Tensor, int]:
    """A spoken prompt from espeak-ng (22.05 kHz) or, without it, a synthetic voiced sound."""
    espeak = shutil.which("espeak-ng")
    if espeak is not None:
        subprocess.run([espeak, "-w", str(path), TRANSCRIPT], check=True, capture_output=True)
        with wave.open(str(path)) as handle:
            rate = handle.getframerate()
            pcm = np.frombuffer(handle.readframes(handle.getnframes()), dtype=np.int16)
        return torch.from_numpy(pcm.astype(np.float32) / 32768.0), rate
    rate = 22050
    t = torch.arange(int(2.2 * rate), dtype=torch.float64) / rate
    f0 = 120 + 20 * torch.sin(2 * math.pi * 3 * t)
    phase = 2 * math.pi * torch.cumsum(f0, 0) / rate
    voiced = sum(torch.sin(k * phase) / k for k in range(1, 8)) * (0.5 + 0.5 * torch.sin(2 * math.pi * 2 * t))
    return (0.2 * voiced).float(), rate


@pytest.fixture(scope="module")
def speaker(model: CosyVoice3, tmp_path_factory: pytest.TempPathFactory) -> SpeakerRecord:
    directory = tmp_path_factory.mktemp("voice")
    wave_in, rate = prompt_recording(directory / "prompt.wav")
    record = model.prepare_speaker(wave_in, rate, TRANSCRIPT)
    path = directory / "voice.safetensors"
    record.save(path)
    return SpeakerRecord.load(path)


def clone(model_dir: Path, target: Path, *, skip: tuple[str, ...] = ()) -> Path:
    """A copy of the model directory made of symlinks, without the files named in ``skip``."""
    target.mkdir()
    for entry in model_dir.iterdir():
        if entry.name not in skip:
            (target / entry.name).symlink_to(entry)
    return target


def reference_tokens(model: CosyVoice3, text: str, speaker: SpeakerRecord, seed: int) -> list[int]:
    """Speech tokens of the facade's request, generated directly with cosyvoice.llm (flow-filtered)."""
    (segment,) = model.text_segments(text)
    prompt = model.build_llm_prompt(segment, speaker, "zero_shot")
    request = LLMRequest(prompt, seed=seed, ras=model.ras, lengths=model.lengths)
    list(generate(model.llm, request))
    return request.flow_tokens


def expected_chunk_sizes(num_prompt: int, num_tokens: int) -> list[int]:
    """Samples per streamed chunk under the official schedule (hops 25 + pad, 50, 100, ...; 3 look-ahead)."""
    sizes, offset, hop = [], 0, 25
    pad = math.ceil(num_prompt / 25) * 25 - num_prompt
    emitted_frames = 0
    while True:
        this_hop = hop + (pad if offset == 0 else 0)
        if num_tokens - offset < this_hop + 3:
            break
        offset += this_hop
        hop = min(100, 2 * hop)
        frames = 2 * offset - 8  # a non-final vocoder call withholds 8 mel frames
        sizes.append(480 * (frames - emitted_frames))
        emitted_frames = frames
    sizes.append(SAMPLES_PER_TOKEN * num_tokens - 480 * emitted_frames)
    return sizes


def test_model_dir_loads_with_release_layout(model_dir: Path, model: CosyVoice3) -> None:
    names = {p.name for p in model_dir.iterdir()}
    assert {"cosyvoice3.yaml", "llm.pt", "llm.rl.pt", "flow.pt", "hift.pt", "CosyVoice-BlankEN"} <= names
    assert {"campplus.onnx", "speech_tokenizer_v3.onnx"} <= names
    assert model.sample_rate == 24000
    assert len(model.tokenizer) == 151924 and model.tokenizer.endofprompt_id == 151646
    assert model.campplus is not None and model.speech_tokenizer is not None
    # Chinese text tokenizes one character at a time, as with the release merges
    assert len(model.tokenizer.encode("欢迎使用语音合成")) >= 8
    hift_keys = torch.load(model_dir / "hift.pt", weights_only=True).keys()
    assert "conv_pre.parametrizations.weight.original1" in hift_keys
    assert not any(key.endswith("weight_g") for key in hift_keys)


def test_voice_survives_a_safetensors_round_trip(model: CosyVoice3, speaker: SpeakerRecord) -> None:
    tokens = speaker.prompt_speech_tokens
    assert 20 <= tokens.numel() <= 100  # a 2-4 s prompt at 25 tokens/s
    assert int(tokens.min()) >= 0 and int(tokens.max()) < 6561
    assert speaker.prompt_mel.shape == (2 * tokens.numel(), 80)
    assert speaker.embedding.shape == (192,)
    assert speaker.prompt_text == TRANSCRIPT
    assert model.tokenizer.decode(speaker.prompt_text_tokens.tolist(), skip_special_tokens=False) == (
        "You are a helpful assistant.<|endofprompt|>" + TRANSCRIPT
    )


@pytest.fixture(scope="module")
def seeded_runs(model: CosyVoice3, speaker: SpeakerRecord) -> dict[str, list[torch.Tensor]]:
    return {
        "streamed": list(model.synthesize(TEXT, speaker, stream=True, seed=7)),
        "offline": list(model.synthesize(TEXT, speaker, stream=False, seed=7)),
    }


def test_stream_and_offline_reproduce_the_reference_pipeline(
    model: CosyVoice3, speaker: SpeakerRecord, seeded_runs: dict[str, list[torch.Tensor]]
) -> None:
    streamed, offline = seeded_runs["streamed"], seeded_runs["offline"]
    tokens = reference_tokens(model, TEXT, speaker, seed=7)
    assert len(tokens) >= 198  # enough for a 100-token hop
    assert all(c.dtype == torch.float32 and c.dim() == 1 for c in streamed + offline)
    # Streaming and offline audio are not sample-equal upstream either (chunk-masked flow hops vs one
    # full-attention pass); what must agree is the token stream, hence the length, and each mode must
    # match the direct composition LLM -> Token2Wav within the parity tolerance.
    assert len(offline) == 1
    assert sum(c.numel() for c in streamed) == offline[0].numel() == SAMPLES_PER_TOKEN * len(tokens)
    reference = model.token2wav.stream(model.speaker_prompt(speaker))
    ref_chunks = reference.push_tokens(tokens) + reference.finish()
    torch.testing.assert_close(torch.cat(streamed), torch.cat(ref_chunks), **WAVE_TOL)
    torch.testing.assert_close(
        offline[0], model.token2wav.offline(tokens, model.speaker_prompt(speaker)), **WAVE_TOL
    )
    for audio in (torch.cat(streamed), offline[0]):
        assert torch.isfinite(audio).all() and audio.abs().max() <= 0.99
        assert audio.pow(2).mean().sqrt() > 1e-3


def test_stream_chunks_follow_the_hop_schedule(
    speaker: SpeakerRecord, seeded_runs: dict[str, list[torch.Tensor]]
) -> None:
    chunks = [c.numel() for c in seeded_runs["streamed"]]
    num_tokens = sum(chunks) // SAMPLES_PER_TOKEN
    num_prompt = speaker.prompt_speech_tokens.numel()
    assert chunks == expected_chunk_sizes(num_prompt, num_tokens)
    assert chunks[1:3] == [50 * SAMPLES_PER_TOKEN, 100 * SAMPLES_PER_TOKEN]  # 25 -> 50 -> 100


def test_interleaved_requests_do_not_disturb_each_other(model: CosyVoice3, speaker: SpeakerRecord) -> None:
    requests = [
        dict(text="Good morning.", mode="zero_shot", seed=11),
        dict(text="你好，早上好。", mode="instruct", instruct_text="请用广东话表达。", seed=12),
    ]
    solo = [list(model.synthesize(speaker=speaker, **r)) for r in requests]
    iterators: list[Iterator[torch.Tensor]] = [model.synthesize(speaker=speaker, **r) for r in requests]
    together: list[list[torch.Tensor]] = [[], []]
    active = [0, 1]
    while active:
        for index in list(active):
            chunk = next(iterators[index], None)
            if chunk is None:
                active.remove(index)
            else:
                together[index].append(chunk)
    for alone, mixed in zip(solo, together, strict=True):
        assert [c.numel() for c in mixed] == [c.numel() for c in alone]
        assert all(torch.equal(a, b) for a, b in zip(alone, mixed, strict=True))
    assert len(solo[0]) > 1 and len(solo[1]) > 1


def test_prompt_layouts_per_mode(model: CosyVoice3, speaker: SpeakerRecord) -> None:
    zero_shot = model.build_llm_prompt("Hi there.", speaker, "zero_shot")
    assert torch.equal(zero_shot.prompt_speech, speaker.prompt_speech_tokens.long())
    assert torch.equal(zero_shot.prompt_text, speaker.prompt_text_tokens.long())
    cross = model.build_llm_prompt("Hi there.", speaker, "cross_lingual")
    assert cross.prompt_speech.numel() == 0 and cross.prompt_text.numel() == 0
    assert model.tokenizer.decode(cross.text.tolist(), skip_special_tokens=False).startswith(
        "You are a helpful assistant.<|endofprompt|>"
    )
    instruct = model.build_llm_prompt("Hi there.", speaker, "instruct", "Speak slowly.")
    assert instruct.prompt_speech.numel() == 0
    assert model.tokenizer.decode(instruct.prompt_text.tolist(), skip_special_tokens=False) == (
        "You are a helpful assistant. Speak slowly.<|endofprompt|>"
    )
    assert len(list(model.synthesize("Hi there.", speaker, mode="cross_lingual", stream=False, seed=1))) == 1


def test_bad_requests_raise_typed_errors(model: CosyVoice3, speaker: SpeakerRecord) -> None:
    with pytest.raises(TextError, match="unknown mode"):
        model.synthesize(TEXT, speaker, mode="karaoke")
    with pytest.raises(TextError, match="instruct_text"):
        model.synthesize(TEXT, speaker, mode="instruct")
    with pytest.raises(TextError, match="nothing to synthesise"):
        model.synthesize(" ?! ", speaker)
    with pytest.raises(SpeakerError, match="SpeakerRecord"):
        model.synthesize(TEXT, "alice")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="seed"):
        model.synthesize(TEXT, speaker, seed=-1)


def test_missing_and_mismatched_files_are_named(model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelFilesError, match=r"flow\.pt"):
        CosyVoice3.from_pretrained(clone(model_dir, tmp_path / "a", skip=("flow.pt",)))
    with pytest.raises(ModelFilesError, match=r"cosyvoice3\.yaml"):
        CosyVoice3.from_pretrained(clone(model_dir, tmp_path / "b", skip=("cosyvoice3.yaml",)))
    broken = clone(model_dir, tmp_path / "c", skip=("llm.pt",))
    state = torch.load(model_dir / "llm.pt", weights_only=True)
    del state["llm.model.model.layers.1.mlp.up_proj.weight"]
    torch.save(state, broken / "llm.pt")
    with pytest.raises(ModelFilesError, match=r"llm\.pt.*layers\.1\.mlp\.up_proj\.weight"):
        CosyVoice3.from_pretrained(broken)


def test_missing_onnx_only_blocks_voice_preparation(
    model_dir: Path, speaker: SpeakerRecord, tmp_path: Path
) -> None:
    model = CosyVoice3.from_pretrained(
        clone(model_dir, tmp_path / "m", skip=("campplus.onnx",)), max_seconds=10
    )
    with pytest.raises(ModelFilesError, match=r"campplus\.onnx") as caught:
        model.prepare_speaker(torch.zeros(32000), 16000, TRANSCRIPT)
    assert caught.value.path is not None and caught.value.path.name == "campplus.onnx"
    chunks = list(model.synthesize("Hi there.", speaker, stream=False, seed=2))
    assert len(chunks) == 1 and chunks[0].numel() > 0


def test_rl_llm_is_loaded_only_when_present(model_dir: Path, model: CosyVoice3, tmp_path: Path) -> None:
    with pytest.raises(ModelFilesError, match=r"llm\.rl\.pt"):
        CosyVoice3.from_pretrained(clone(model_dir, tmp_path / "r", skip=("llm.rl.pt",)), use_rl_llm=True)
    rl = CosyVoice3.from_pretrained(model_dir, use_rl_llm=True, max_seconds=10)
    base_weight = model.llm.llm_decoder.weight
    assert not torch.equal(rl.llm.llm_decoder.weight, base_weight)
    expected = torch.load(model_dir / "llm.rl.pt", weights_only=True)["llm_decoder.weight"]
    assert torch.equal(rl.llm.llm_decoder.weight, expected)


def test_reduced_precision_model_synthesizes(model_dir: Path, speaker: SpeakerRecord) -> None:
    model = CosyVoice3.from_pretrained(model_dir, dtype=torch.bfloat16, max_seconds=10)
    assert model.llm.llm_decoder.weight.dtype == torch.bfloat16
    assert model.token2wav.hift.f0_predictor.classifier.weight.dtype == torch.float64
    (chunk,) = model.synthesize("Hi.", speaker, stream=False, seed=4)
    assert chunk.dtype == torch.float32 and chunk.numel() % SAMPLES_PER_TOKEN == 0
    assert torch.isfinite(chunk).all() and chunk.abs().max() <= 0.99
    with pytest.raises(ValueError, match="dtype"):
        CosyVoice3.from_pretrained(model_dir, dtype=torch.int8)
