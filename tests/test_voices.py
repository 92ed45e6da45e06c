"""VoiceStore: presets on disk, uploads, removal, feature-cache names, the espeak-ng stand-in prompt."""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import numpy as np
import pytest
import yaml

from audio_codecs.wav import read_wav, wav_bytes
from gateway.voices.store import VoiceExists, VoiceStore
from tts_engine.errors import UnknownVoice
from tts_engine.voices import VoiceError, VoicePreset, decode_prompt_wav


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
    with caplog.at_level(logging.WARNING):
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
    digest = hashlib.sha256(data).hexdigest()[:16]
    assert preset.prompt_wav == (tmp_path / "voices" / f"new_voice-1.{digest}.wav").resolve()
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


# ---- one voice, one atomic unit ------------------------------------------------------------------


def add_and_crash(folder: Path, wav: bytes, crash_at: int) -> int:
    """Overwrite voice "alice" in a forked process killed at its ``crash_at``-th rename, unlink or fsync.

    Returns the child's exit code: 17 when it was killed, 0 when the add ran to its end first.
    """
    pid = os.fork()
    if pid == 0:  # the child: no cleanup runs when it "dies", as after a power cut or SIGKILL
        calls = 0

        def crashing(real):
            def call(*args, **kwargs):
                nonlocal calls
                calls += 1
                if calls == crash_at:
                    os._exit(17)
                return real(*args, **kwargs)

            return call

        try:
            store = VoiceStore(folder)
            store.load(strict=True)
            os.replace, os.unlink, os.fsync = crashing(os.replace), crashing(os.unlink), crashing(os.fsync)
            store.add("alice", wav, "新的。", overwrite=True)
        finally:
            os._exit(0 if calls < crash_at else 1)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def age_everything(folder: Path, seconds: float = 3600) -> None:
    """Make every file look as old as leftovers of a crash long ago."""
    for path in folder.rglob("*"):
        stamp = path.stat().st_mtime - seconds
        os.utime(path, (stamp, stamp))


def test_a_crash_at_any_step_of_an_overwrite_leaves_the_old_or_the_new_voice(tmp_path: Path) -> None:
    old_wav, new_wav = tone_wav(freq=220.0), tone_wav(freq=330.0)
    outcomes = []
    for crash_at in range(1, 30):
        folder = tmp_path / f"crash{crash_at}"
        folder.mkdir()
        (folder / "alice.wav").write_bytes(old_wav)  # the layout earlier versions wrote
        write_preset(folder, "alice", prompt_wav="alice.wav", prompt_text="旧的。")
        exit_code = add_and_crash(folder, new_wav, crash_at)
        assert exit_code in (0, 17)
        age_everything(folder)
        alice = VoiceStore(folder).load(strict=True)[0]  # the restart
        assert alice.prompt_wav is not None
        version = (alice.prompt_text, alice.prompt_wav.read_bytes())
        assert version in [("旧的。", old_wav), ("新的。", new_wav)], f"crash at step {crash_at}: mixed voice"
        outcomes.append(version[0])
        left = sorted(p.name for p in folder.iterdir())
        assert left == sorted(["alice.yaml", alice.prompt_wav.name]), f"crash at step {crash_at}: {left}"
        if exit_code == 0:
            break
    assert outcomes[0] == "旧的。" and outcomes[-1] == "新的。" and len(outcomes) > 3


def test_a_failed_write_keeps_the_old_voice_and_leaves_no_files(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = VoiceStore(folder)
    store.load(strict=True)
    before = sorted(p.name for p in folder.iterdir())
    real_replace = os.replace

    def full_disk(src: str, dst: str | os.PathLike[str]) -> None:
        if str(dst).endswith(".yaml"):
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(OSError, match="No space"):
        store.add("alice", tone_wav(freq=330.0), "新的。", overwrite=True)
    monkeypatch.undo()
    assert sorted(p.name for p in folder.iterdir()) == before
    assert store.get("alice").prompt_text == "你好。"
    reloaded = VoiceStore(folder).load(strict=True)[0]
    assert reloaded.prompt_text == "你好。" and reloaded.prompt_wav.read_bytes() == tone_wav()


def test_a_staged_voice_is_invisible_until_committed_and_discard_leaves_nothing(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path)
    store.add("alice", tone_wav(), "旧的。")
    files = sorted(p.name for p in tmp_path.iterdir())
    staged = store.stage("alice", tone_wav(freq=330.0), "新的。", overwrite=True)
    assert store.get("alice").prompt_text == "旧的。"
    assert VoiceStore(tmp_path).load(strict=True)[0].prompt_text == "旧的。"  # a restart now: the old voice
    store.discard(staged)
    assert sorted(p.name for p in tmp_path.iterdir()) == files
    new = store.stage("bob", tone_wav(), "你好。")
    store.discard(new)
    assert sorted(p.name for p in tmp_path.iterdir()) == files  # same recording as alice's: kept for her
    store.commit(store.stage("alice", tone_wav(freq=330.0), "新的。", overwrite=True))
    assert len(list(tmp_path.glob("*.wav"))) == 1  # the former recording went with the commit
    assert VoiceStore(tmp_path).load(strict=True)[0].prompt_text == "新的。"


def test_load_removes_stale_leftovers_and_keeps_young_ones_and_user_files(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path)
    store.add("alice", tone_wav(), "你好。")
    (tmp_path / "user.wav").write_bytes(tone_wav())  # not ours: never removed
    (tmp_path / ".alice.yaml.x1y2.tmp").write_bytes(b"half a yaml")
    (tmp_path / f"alice.{'ab' * 8}.wav").write_bytes(tone_wav(freq=440.0))  # an upload never committed
    (tmp_path / ".cache").mkdir()
    (tmp_path / ".cache" / ".bob.espeak.0123.wav.zz.tmp").write_bytes(b"half a wav")
    age_everything(tmp_path)
    (tmp_path / ".bob.wav.young.tmp").write_bytes(b"another process is writing this")
    kept = {"alice.yaml", store.get("alice").prompt_wav.name, "user.wav", ".bob.wav.young.tmp", ".cache"}
    assert [p.name for p in VoiceStore(tmp_path).load(strict=True)] == ["alice"]
    assert {p.name for p in tmp_path.iterdir()} == kept
    assert not list((tmp_path / ".cache").iterdir())


def test_refresh_picks_up_what_another_store_on_the_folder_changed(folder: Path) -> None:
    mine, theirs = VoiceStore(folder), VoiceStore(folder)  # two gateways sharing voices/
    assert mine.refresh() is False  # nothing before load()
    mine.load()
    theirs.load()
    assert mine.refresh() is False  # nothing changed
    added = theirs.add("bob", tone_wav(1.5), "你好。", description="theirs")
    theirs.add("alice", tone_wav(2.5), "新的。", overwrite=True)
    theirs.remove("styled")
    write_preset(folder, "broken", prompt_wav="missing.wav")  # a bad one is skipped, not fatal
    assert mine.refresh() is True
    assert mine.names() == ["alice", "bob"]
    assert mine.get("bob") == added and mine.get("alice").prompt_text == "新的。"
    assert mine.refresh() is False
