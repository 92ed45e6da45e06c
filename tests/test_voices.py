"""VoiceStore: presets on disk, uploads, removal, feature-cache names, the espeak-ng stand-in prompt."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import yaml

from audio_codecs.wav import read_wav, wav_bytes
from tts_engine.errors import UnknownVoice
from tts_engine.voices import (
    VoiceError,
    VoiceExists,
    VoicePreset,
    VoiceStore,
    decode_prompt_wav,
)


def tone_wav(seconds: float = 2.0, rate: int = 16000, channels: int = 1, freq: float = 220.0) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    mono = (0.3 * np.sin(2 * np.pi * freq * t) * 32767).astype(np.int16)
    return wav_bytes(mono if channels == 1 else np.stack([mono] * channels, axis=1), rate)


def write_preset(directory: Path, name: str, **fields: object) -> Path:
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, **fields}, allow_unicode=True), encoding="utf-8")
    return path


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "a.wav").write_bytes(tone_wav())
    write_preset(tmp_path, "alice", prompt_wav="a.wav", prompt_text="你好。", description="first")
    write_preset(tmp_path, "styled", prompt_wav="a.wav", prompt_text="你好。", instruct="用四川话说")
    return tmp_path


def test_load_reads_valid_presets(folder: Path) -> None:
    store = VoiceStore(folder)
    presets = store.load(strict=True)
    assert [p.name for p in presets] == ["alice", "styled"]
    alice = store.get("alice")
    assert alice == VoicePreset("alice", (folder / "a.wav").resolve(), "你好。", None, "first")
    assert store.get("styled").instruct == "用四川话说"
    assert "alice" in store and "bob" not in store


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"name": "other", "prompt_wav": "a.wav"}, "file stem"),
        ({"prompt_wav": "missing.wav", "prompt_text": "x"}, "not found"),
        ({"prompt_wav": "a.wav", "colour": "red"}, "unknown field"),
        ({"prompt_wav": "a.wav", "prompt_text": 5}, "prompt_text"),
        ({"prompt_wav": "a.wav", "fallback": "magic"}, "fallback"),
        ({"prompt_wav": "short.wav", "prompt_text": "x"}, "s long"),
    ],
)
def test_a_bad_preset_is_skipped_or_raises_with_strict(
    folder: Path, fields: dict, message: str, caplog: pytest.LogCaptureFixture
) -> None:
    (folder / "short.wav").write_bytes(tone_wav(0.5))
    (folder / "bad.yaml").write_text(yaml.safe_dump({"name": "bad", **fields}), encoding="utf-8")
    store = VoiceStore(folder)
    with caplog.at_level(logging.ERROR):
        assert [p.name for p in store.load()] == ["alice", "styled"]
    assert "bad.yaml" in caplog.text and message in caplog.text
    with pytest.raises(VoiceError, match=message):
        store.load(strict=True)


def test_unparseable_yaml_and_unknown_names(folder: Path) -> None:
    (folder / "broken.yaml").write_text("name: [unclosed", encoding="utf-8")
    store = VoiceStore(folder)
    with pytest.raises(VoiceError, match="broken.yaml"):
        store.load(strict=True)
    store.load()
    with pytest.raises(UnknownVoice, match="bob"):
        store.get("bob")


def test_add_writes_wav_and_yaml_that_load_again(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path / "voices")
    store.load()
    data = tone_wav(3.0, rate=48000, channels=2)
    preset = store.add("new_voice-1", data, " 今天天气很好。 ", instruct="用粤语说", description="d")
    assert preset.prompt_wav == (tmp_path / "voices" / "new_voice-1.wav").resolve()
    assert preset.prompt_wav.read_bytes() == data
    assert (preset.prompt_text, preset.instruct, preset.description) == ("今天天气很好。", "用粤语说", "d")
    fresh = VoiceStore(tmp_path / "voices")
    assert fresh.load(strict=True) == [preset]
    assert not list((tmp_path / "voices").glob("*.tmp"))


def test_add_refuses_duplicates_unless_overwrite(folder: Path) -> None:
    store = VoiceStore(folder)
    store.load()
    with pytest.raises(VoiceExists):
        store.add("alice", tone_wav(), "x")
    replaced = store.add("alice", tone_wav(freq=330.0), "新的。", overwrite=True)
    assert replaced.prompt_text == "新的。" and store.get("alice") == replaced
    assert VoiceStore(folder).load(strict=True)[0].prompt_text == "新的。"


@pytest.mark.parametrize(
    ("name", "data", "message"),
    [
        ("bad name!", tone_wav(), "voice name"),
        ("x" * 65, tone_wav(), "voice name"),
        ("ok", b"not a wav at all", "not a readable WAV"),
        ("ok", tone_wav(0.5), "s long"),
        ("ok", tone_wav(31.0, rate=16000), "s long"),
        ("ok", tone_wav(2.0, rate=8000), "16000 Hz"),
    ],
)
def test_add_rejects_bad_uploads(tmp_path: Path, name: str, data: bytes, message: str) -> None:
    store = VoiceStore(tmp_path)
    with pytest.raises(VoiceError, match=message):
        store.add(name, data, "text")
    assert not list(tmp_path.iterdir())


def test_decode_prompt_wav_mixes_to_mono_and_limits_size() -> None:
    audio = decode_prompt_wav(tone_wav(2.0, rate=44100, channels=2))
    mono, rate = read_wav(tone_wav(2.0, rate=44100))
    assert audio.sample_rate == 44100 and audio.samples.ndim == 1
    np.testing.assert_allclose(audio.samples, mono, atol=1e-6)
    assert audio.seconds == pytest.approx(2.0)
    with pytest.raises(VoiceError, match="limit"):
        decode_prompt_wav(b"RIFF" + bytes(17 * 1024 * 1024))


def test_remove_deletes_files_and_cached_features(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path)
    store.add("bob", tone_wav(), "你好。")
    store.add("bobby", tone_wav(), "你好。")
    store.cache_dir.mkdir()
    cached = store.cache_path("bob")
    cached.write_bytes(b"features")
    other = store.cache_path("bobby")
    other.write_bytes(b"features")
    store.remove("bob")
    assert not (tmp_path / "bob.yaml").exists() and not (tmp_path / "bob.wav").exists()
    assert not cached.exists() and other.exists()
    assert [p.name for p in VoiceStore(tmp_path).load()] == ["bobby"]
    with pytest.raises(UnknownVoice):
        store.remove("bob")


def test_remove_keeps_a_recording_shared_with_another_preset(folder: Path) -> None:
    store = VoiceStore(folder)
    store.load()
    store.remove("alice")
    assert (folder / "a.wav").exists() and store.names() == ["styled"]


def test_cache_path_follows_recording_transcript_and_key(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path)
    store.add("v", tone_wav(), "一。")
    first = store.cache_path("v")
    assert first.parent == tmp_path.resolve() / ".cache"
    assert first.name.startswith("v.") and first.suffix == ".safetensors"
    assert store.cache_path("v") == first
    assert store.cache_path("v", key="model-b") != first
    store.add("v", tone_wav(), "二。", overwrite=True)
    second = store.cache_path("v")
    assert second != first
    store.add("v", tone_wav(freq=440.0), "二。", overwrite=True)
    assert store.cache_path("v") not in (first, second)


def test_missing_recording_falls_back_to_espeak(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write_preset(tmp_path, "default", prompt_wav="default.wav", prompt_text="希望你以后能够做的比我还好呦。",
                 fallback="espeak")  # fmt: skip
    write_preset(tmp_path, "plain", prompt_wav="gone.wav", prompt_text="你好。")
    store = VoiceStore(tmp_path)
    with caplog.at_level(logging.WARNING):
        presets = store.load()
    assert [p.name for p in presets] == ["default"]  # no fallback for "plain": skipped
    stand_in = presets[0].prompt_wav
    assert stand_in is not None and stand_in.parent == store.cache_dir
    audio = decode_prompt_wav(stand_in.read_bytes())
    assert audio.seconds > 1.0 and np.abs(audio.samples).max() > 0.05
    assert "espeak-ng" in caplog.text and "default.wav" in caplog.text
    assert VoiceStore(tmp_path).load()[0].prompt_wav == stand_in  # made once, reused
