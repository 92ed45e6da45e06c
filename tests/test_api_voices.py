"""GET/POST/DELETE /v1/voices and POST /tts/zero_shot against a real loopback server."""

from __future__ import annotations

import logging
import struct
import time

import httpx
import numpy as np
import pytest
import yaml

from audio_codecs.formats import encode_audio
from audio_codecs.wav import float_to_int16, read_wav
from gateway.voices.store import VoiceStore
from scripts.device_sim import DeviceSimulator
from tests.api_helpers import CloningFakeBackend, dominant_hz, fake, prompt_wav, voice_hz, wait_until
from tests.gateway_server import running_gateway
from tts_engine.voices import VoiceError

TEXT = "今天天气很好，我们去公园玩吧"


def voices_config(tmp_path, **api) -> dict:
    return {"tts": {"voices_dir": str(tmp_path)}, "api": api}


def saved_wav(folder, name: str) -> str:
    """The recording file a saved voice's YAML names."""
    return yaml.safe_load((folder / f"{name}.yaml").read_text(encoding="utf-8"))["prompt_wav"]


def upload(name: str = "alice", wav: bytes | None = None, **fields) -> dict:
    data = {"name": name, "prompt_text": "希望你以后能够做的比我还好呦。", **fields}
    return {
        "data": data,
        "files": {"prompt_wav": ("prompt.wav", prompt_wav() if wav is None else wav, "audio/wav")},
    }


async def test_list_voices_of_a_backend_without_cloning():
    async with running_gateway(backend=fake(voices=("default", "bob"))) as gw, httpx.AsyncClient() as client:
        listed = await client.get(f"{gw.url}/v1/voices")
        added = await client.post(f"{gw.url}/v1/voices", **upload())
        zero_shot = await client.post(f"{gw.url}/tts/zero_shot", data={"text": "hi", "prompt_text": "你好"},
                                      files={"prompt_wav": ("p.wav", prompt_wav(), "audio/wav")})  # fmt: skip
    body = listed.json()
    assert [v["name"] for v in body["data"]] == ["default", "bob"]
    assert body["default"] == "default" and body["supports_cloning"] is False
    assert body["data"][0] == {**body["data"][0], "source": "builtin", "loaded": True, "default": True}
    assert body["aliases"]["alloy"] == "default"
    for reply in (added, zero_shot):
        assert reply.status_code == 501 and reply.json()["error"]["code"] == "cloning_unsupported"


async def test_added_voice_is_saved_prepared_and_usable_at_once(tmp_path):
    backend = CloningFakeBackend()
    async with running_gateway(voices_config(tmp_path), backend=backend) as gw, httpx.AsyncClient() as client:
        added = await client.post(f"{gw.url}/v1/voices", **upload(description="test voice"))
        listed = (await client.get(f"{gw.url}/v1/voices")).json()
        speech = await client.post(f"{gw.url}/v1/tts", json={"text": TEXT, "voice": "alice"})
    assert added.status_code == 201
    assert added.json() == {**added.json(), "name": "alice", "source": "preset", "loaded": True,
                            "description": "test voice", "prompt_text": "希望你以后能够做的比我还好呦。"}  # fmt: skip
    preset = yaml.safe_load((tmp_path / "alice.yaml").read_text(encoding="utf-8"))
    assert preset["name"] == "alice" and preset["prompt_wav"].startswith("alice.")
    assert (tmp_path / preset["prompt_wav"]).read_bytes() == prompt_wav()
    assert [p.name for p in backend.added] == ["alice"]  # features prepared once, by the engine
    assert "alice" in [v["name"] for v in listed["data"]]
    samples, rate = read_wav(speech.content)
    assert speech.status_code == 200 and abs(dominant_hz(samples, rate) - voice_hz(backend, "alice")) < 3


async def test_presets_in_the_folder_are_loaded_at_startup(tmp_path):
    (tmp_path / "carol.wav").write_bytes(prompt_wav())
    (tmp_path / "carol.yaml").write_text(
        "name: carol\nprompt_wav: carol.wav\nprompt_text: 你好\n", encoding="utf-8"
    )
    async with running_gateway(voices_config(tmp_path), backend=CloningFakeBackend()) as gw:
        async with httpx.AsyncClient() as client:
            listed = (await client.get(f"{gw.url}/v1/voices")).json()
            speech = await client.post(f"{gw.url}/v1/tts", json={"text": TEXT, "voice": "carol"})
    carol = next(v for v in listed["data"] if v["name"] == "carol")
    assert carol["source"] == "preset" and carol["prompt_text"] == "你好" and speech.status_code == 200


async def test_existing_names_conflict_unless_overwritten(tmp_path):
    backend = CloningFakeBackend()
    async with running_gateway(voices_config(tmp_path), backend=backend) as gw, httpx.AsyncClient() as client:
        first = await client.post(f"{gw.url}/v1/voices", **upload())
        again = await client.post(f"{gw.url}/v1/voices", **upload())
        replaced = await client.post(f"{gw.url}/v1/voices", **upload(overwrite="true", prompt_text="新的"))
        builtin = await client.post(f"{gw.url}/v1/voices", **upload(name="default"))
    assert first.status_code == 201 and replaced.status_code == 201
    assert again.status_code == 409 and again.json()["error"]["code"] == "voice_exists"
    assert builtin.status_code == 409
    assert yaml.safe_load((tmp_path / "alice.yaml").read_text(encoding="utf-8"))["prompt_text"] == "新的"


def tone_wav(seconds: float, rate: int) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    return encode_audio(float_to_int16(0.3 * np.sin(2 * np.pi * 150 * t)), rate, "wav")


@pytest.mark.parametrize(
    ("fields", "wav", "status", "param"),
    [
        ({"name": "no spaces"}, None, 400, "name"),
        ({"prompt_text": "  "}, None, 400, "prompt_text"),
        ({}, tone_wav(2.5, 16000), 400, "prompt_wav"),  # longer than max_prompt_seconds (2 s here)
        ({}, tone_wav(0.5, 16000), 400, None),  # shorter than the store's 1 s minimum
        ({}, tone_wav(1.5, 8000), 400, None),  # below 16 kHz
        ({}, b"this is not audio at all", 400, "prompt_wav"),
        ({}, b"", 400, "prompt_wav"),
        ({}, tone_wav(2.6, 48000), 413, "prompt_wav"),  # bigger than max_prompt_bytes (200 kB here)
        ({}, tone_wav(1.9, 48000) * 4, 413, None),  # refused from its Content-Length, before parsing
    ],
)
async def test_bad_uploads_are_refused_with_a_clear_message(tmp_path, fields, wav, status, param):
    backend = CloningFakeBackend()
    config = voices_config(tmp_path, max_prompt_seconds=2, max_prompt_bytes=200_000)
    async with running_gateway(config, backend=backend) as gw, httpx.AsyncClient() as client:
        reply = await client.post(f"{gw.url}/v1/voices", **upload(wav=wav, **{"name": "alice", **fields}))
    assert reply.status_code == status and reply.json()["error"]["message"]
    if param:
        assert reply.json()["error"]["param"] == param
    assert backend.added == [] and not list(tmp_path.glob("*.yaml"))


class PickyBackend(CloningFakeBackend):
    def add_voice(self, preset):
        if preset.prompt_text == "坏":
            raise VoiceError(f"voice {preset.name!r}: the model cannot use this prompt")
        super().add_voice(preset)


async def test_a_voice_the_engine_cannot_prepare_is_not_kept(tmp_path):
    backend = PickyBackend()
    async with running_gateway(voices_config(tmp_path), backend=backend) as gw, httpx.AsyncClient() as client:
        refused = await client.post(f"{gw.url}/v1/voices", **upload(prompt_text="坏"))
        listed = (await client.get(f"{gw.url}/v1/voices")).json()
    assert refused.status_code == 400 and "cannot use this prompt" in refused.json()["error"]["message"]
    assert "alice" not in [v["name"] for v in listed["data"]] and not list(tmp_path.iterdir())


async def test_compressed_uploads_are_stored_as_wav(tmp_path):
    mp3 = encode_audio(float_to_int16(0.3 * np.sin(2 * np.pi * 150 * np.arange(48000) / 24000)), 24000, "mp3")
    async with running_gateway(voices_config(tmp_path), backend=CloningFakeBackend()) as gw:
        async with httpx.AsyncClient() as client:
            reply = await client.post(f"{gw.url}/v1/voices", **upload(wav=mp3))
    assert reply.status_code == 201
    samples, rate = read_wav((tmp_path / saved_wav(tmp_path, "alice")).read_bytes())
    assert rate == 24000 and abs(samples.size / rate - 2.0) < 0.1


async def test_delete_removes_the_voice_and_its_files(tmp_path):
    backend = CloningFakeBackend()
    config = voices_config(tmp_path, unknown_voice="strict")  # a removed voice is refused, not replaced
    async with running_gateway(config, backend=backend) as gw, httpx.AsyncClient() as client:
        await client.post(f"{gw.url}/v1/voices", **upload())
        deleted = await client.delete(f"{gw.url}/v1/voices/alice")
        listed = (await client.get(f"{gw.url}/v1/voices")).json()
        speech = await client.post(f"{gw.url}/v1/tts", json={"text": TEXT, "voice": "alice"})
        again = await client.delete(f"{gw.url}/v1/voices/alice")
        builtin = await client.delete(f"{gw.url}/v1/voices/default")
    assert deleted.status_code == 204 and deleted.content == b""
    assert not list(tmp_path.iterdir())  # the YAML and the recording
    assert "alice" not in [v["name"] for v in listed["data"]] and "alice" not in backend.voices()
    assert speech.status_code == 400 and speech.json()["error"]["code"] == "unknown_voice"
    assert again.status_code == 404 and builtin.status_code == 409


async def test_a_voice_added_through_the_api_is_used_by_a_device_session_without_restart(tmp_path):
    backend = CloningFakeBackend(ms_per_char=60.0)
    config = {**voices_config(tmp_path), "tts": {"voices_dir": str(tmp_path), "voice": "narrator"}}
    async with running_gateway(config, backend=backend) as gw:
        sim = DeviceSimulator(gw.url)
        await sim.connect()
        async with httpx.AsyncClient() as client:
            added = await client.post(f"{gw.url}/v1/voices", **upload(name="narrator"))
        turn = await sim.ask("请用新的声音读这一句话，谢谢")
        await sim.close()
    assert added.status_code == 201
    assert turn.audio is not None and turn.audio.size > turn.sample_rate // 2  # the reply was spoken
    assert abs(dominant_hz(turn.audio, turn.sample_rate) - voice_hz(backend, "narrator")) < 3


# ---- /tts/zero_shot ------------------------------------------------------------------------------


async def test_zero_shot_streams_raw_pcm_in_a_one_off_voice(tmp_path):
    backend = CloningFakeBackend()
    files = {"prompt_wav": ("p.wav", prompt_wav(), "audio/wav")}
    async with running_gateway(voices_config(tmp_path), backend=backend) as gw, httpx.AsyncClient() as client:
        start = time.monotonic()
        pcm = await client.post(
            f"{gw.url}/tts/zero_shot", data={"text": TEXT, "prompt_text": "你好"}, files=files
        )
        elapsed = time.monotonic() - start
        wav = await client.post(f"{gw.url}/tts/zero_shot", data={"text": TEXT, "format": "wav", "prompt_text": "你好",
                                                                  "sample_rate": "16000"}, files=files)  # fmt: skip
        listed = (await client.get(f"{gw.url}/v1/voices")).json()
    assert pcm.status_code == 200 and pcm.headers["content-type"] == "audio/pcm" and elapsed < 5
    assert len(pcm.content) == 2 * backend.num_samples_for(TEXT)
    prompt, prompt_text = backend.zero_shot_prompts[0]
    assert prompt_text == "你好" and prompt.sample_rate == 16000 and abs(prompt.seconds - 2.0) < 1e-3
    assert wav.status_code == 200 and wav.headers["content-type"] == "audio/wav"
    assert struct.unpack_from("<I", wav.content, 24)[0] == 16000
    assert len(listed["data"]) == 1 and not list(tmp_path.glob("*.yaml"))  # nothing saved


async def test_zero_shot_bad_requests(tmp_path):
    files = {"prompt_wav": ("p.wav", prompt_wav(), "audio/wav")}
    async with running_gateway(voices_config(tmp_path), backend=CloningFakeBackend()) as gw:
        async with httpx.AsyncClient() as client:
            no_text = await client.post(f"{gw.url}/tts/zero_shot", data={"prompt_text": "x"}, files=files)
            no_transcript = await client.post(f"{gw.url}/tts/zero_shot", data={"text": "hi"}, files=files)
            mp3 = await client.post(
                f"{gw.url}/tts/zero_shot",
                data={"text": "hi", "prompt_text": "x", "format": "mp3"},
                files=files,
            )
            short = await client.post(f"{gw.url}/tts/zero_shot", data={"text": "hi", "prompt_text": "x"},
                                      files={"prompt_wav": ("p.wav", tone_wav(0.3, 16000), "audio/wav")})  # fmt: skip
    assert no_text.status_code == 400 and no_text.json()["error"]["param"] == "text"
    assert no_transcript.status_code == 400 and no_transcript.json()["error"]["param"] == "prompt_text"
    assert mp3.status_code == 400 and mp3.json()["error"]["param"] == "format"
    assert short.status_code == 400 and "1..30 s" in short.json()["error"]["message"]


# ---- malformed audio: always 400, never 500; a bad preset never stops the server ----------------


def wav_with_fmt(tag: int = 1, channels: int = 1, rate: int = 16000, bits: int = 16, align: int | None = None,
                 data: bytes = bytes(64000)) -> bytes:  # fmt: skip
    align = channels * bits // 8 if align is None else align
    fmt = struct.pack("<HHIIHH", tag, channels, rate, (rate * align) & 0xFFFFFFFF, align, bits)
    body = b"WAVEfmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


BAD_AUDIO = {
    "bits 0, block_align 0": wav_with_fmt(bits=0, align=0),
    "channels 0": wav_with_fmt(channels=0),
    "sample rate 0": wav_with_fmt(rate=0),
    "sample rate 2^32-1": wav_with_fmt(rate=0xFFFFFFFF),
    "format tag 0x55": wav_with_fmt(tag=0x55),
    "data size past the end": wav_with_fmt()[:-63000],  # 0.03 s left: too short
    "no samples": wav_with_fmt(data=b""),
    "cut in the header": wav_with_fmt()[:30],
    "not audio": b"\x89PNG\r\n\x1a\n" + bytes(200),
    "RIFF but not WAVE": b"RIFF\x10\x00\x00\x00AVI LIST" + bytes(8),
    "ten minutes of FLAC silence": encode_audio(np.zeros(16000 * 600, dtype=np.int16), 16000, "flac"),
}


@pytest.mark.parametrize("bad", BAD_AUDIO.values(), ids=BAD_AUDIO.keys())
async def test_malformed_prompt_audio_is_a_400_on_both_cloning_endpoints(tmp_path, bad):
    backend = CloningFakeBackend()
    async with running_gateway(voices_config(tmp_path), backend=backend) as gw, httpx.AsyncClient() as client:
        added = await client.post(f"{gw.url}/v1/voices", **upload(wav=bad))
        once = await client.post(f"{gw.url}/tts/zero_shot", data={"text": TEXT, "prompt_text": "你好"},
                                 files={"prompt_wav": ("p.wav", bad, "audio/wav")})  # fmt: skip
        healthy = await client.post(f"{gw.url}/v1/tts", json={"text": TEXT})
    for reply in (added, once):
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"]["message"]
    assert healthy.status_code == 200
    assert backend.added == [] and not list(tmp_path.iterdir())


async def test_bad_presets_are_skipped_and_the_server_starts(tmp_path, caplog):
    (tmp_path / "good.wav").write_bytes(prompt_wav())
    (tmp_path / "good.yaml").write_text(
        "name: good\nprompt_wav: good.wav\nprompt_text: 你好\n", encoding="utf-8"
    )
    (tmp_path / "bits0.wav").write_bytes(wav_with_fmt(bits=0, align=0))
    (tmp_path / "bits0.yaml").write_text(
        "name: bits0\nprompt_wav: bits0.wav\nprompt_text: 你好\n", encoding="utf-8"
    )
    (tmp_path / "gone.yaml").write_text(
        "name: gone\nprompt_wav: gone.wav\nprompt_text: 你好\n", encoding="utf-8"
    )
    (tmp_path / "broken.yaml").write_text("name: [unclosed\n", encoding="utf-8")
    (tmp_path / "deep.yaml").write_text("[" * 5000 + "]" * 5000, encoding="utf-8")
    (tmp_path / "binary.yaml").write_bytes(b"\xff\xfe\x00garbage")
    (tmp_path / "huge.yaml").write_text("name: huge\ndescription: " + "x" * 200_000 + "\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        async with running_gateway(voices_config(tmp_path), backend=CloningFakeBackend()) as gw:
            async with httpx.AsyncClient() as client:
                listed = (await client.get(f"{gw.url}/v1/voices")).json()
    assert [v["name"] for v in listed["data"] if v["source"] == "preset"] == ["good"]
    for name in ("bits0", "gone", "broken", "deep", "binary", "huge"):
        assert f"{name}.yaml" in caplog.text


# ---- an add is one unit: answered 201, or nothing changed ----------------------------------------


async def test_a_refused_overwrite_keeps_the_old_voice_on_disk_and_in_the_engine(tmp_path):
    backend = PickyBackend()
    async with running_gateway(voices_config(tmp_path), backend=backend) as gw, httpx.AsyncClient() as client:
        first = await client.post(f"{gw.url}/v1/voices", **upload(prompt_text="旧的"))
        files = sorted(p.name for p in tmp_path.iterdir())
        refused = await client.post(
            f"{gw.url}/v1/voices", **upload(wav=prompt_wav(3.0), prompt_text="坏", overwrite="true")
        )
        speech = await client.post(f"{gw.url}/v1/tts", json={"text": TEXT, "voice": "alice"})
        listed = (await client.get(f"{gw.url}/v1/voices")).json()
    assert first.status_code == 201 and refused.status_code == 400
    assert sorted(p.name for p in tmp_path.iterdir()) == files  # the refused recording is gone
    alice = next(v for v in listed["data"] if v["name"] == "alice")
    assert alice["prompt_text"] == "旧的" and alice["loaded"] and speech.status_code == 200
    assert VoiceStore(tmp_path).load(strict=True)[0].prompt_text == "旧的"  # and after a restart


class SlowPreparingBackend(CloningFakeBackend):
    def add_voice(self, preset):
        time.sleep(0.8)  # preparing features takes a while (in the engine thread)
        super().add_voice(preset)


async def test_an_add_whose_client_goes_away_leaves_nothing_behind(tmp_path):
    backend = SlowPreparingBackend()
    async with running_gateway(voices_config(tmp_path), backend=backend) as gw:
        async with httpx.AsyncClient(timeout=httpx.Timeout(5.0, read=0.3)) as client:
            with pytest.raises(httpx.ReadTimeout):  # the client gives up while the voice is prepared
                await client.post(f"{gw.url}/v1/voices", **upload())
        # the preparation ends, then the server rolls back
        await wait_until(lambda: not list(tmp_path.iterdir()) and "alice" not in backend.voices(), timeout=10)
        async with httpx.AsyncClient() as client:
            listed = (await client.get(f"{gw.url}/v1/voices")).json()
        in_engine, on_disk = backend.voices(), list(tmp_path.iterdir())
        async with httpx.AsyncClient() as client:
            again = await client.post(f"{gw.url}/v1/voices", **upload())  # the name is free
    assert "alice" not in [v["name"] for v in listed["data"]] and "alice" not in in_engine
    assert on_disk == [] and again.status_code == 201


async def test_invalid_utf8_in_a_form_field_is_a_400_not_mojibake(tmp_path):
    # issue 23: Starlette decoded it as Latin-1, and the transcript was stored as mojibake
    bad = "你好".encode() + b"\xff\xfe" + "世界".encode()
    files = {"prompt_wav": ("p.wav", prompt_wav(), "audio/wav")}
    async with running_gateway(voices_config(tmp_path), backend=CloningFakeBackend()) as gw:
        async with httpx.AsyncClient() as client:
            added = await client.post(f"{gw.url}/v1/voices", data={"name": "alice", "prompt_text": bad}, files=files)
            zero_shot = await client.post(
                f"{gw.url}/tts/zero_shot", data={"text": "hi", "prompt_text": bad}, files=files
            )
            good = await client.post(f"{gw.url}/v1/voices", **upload())
    for reply in (added, zero_shot):
        error = reply.json()["error"]
        assert reply.status_code == 400 and error["code"] == "invalid_text" and error["param"] == "prompt_text"
        assert error["message"] == "prompt_text is not valid utf-8: byte 0xff at position 6"
    assert good.status_code == 201  # valid UTF-8 (Chinese) still passes
    assert [p.stem for p in tmp_path.glob("*.yaml")] == ["alice"]
    assert yaml.safe_load((tmp_path / "alice.yaml").read_text(encoding="utf-8"))["prompt_text"] == (
        "希望你以后能够做的比我还好呦。"
    )


async def test_voices_are_served_under_v1_audio_voices_too(tmp_path):
    # issue 23: the CosyVoice3 servers users compare us with serve them there
    async with running_gateway(voices_config(tmp_path, api_keys=["k"]), backend=CloningFakeBackend()) as gw:
        key = {"Authorization": "Bearer k"}
        async with httpx.AsyncClient(headers=key) as client:
            added = await client.post(f"{gw.url}/v1/audio/voices", **upload("bob"))
            both = [(await client.get(f"{gw.url}{path}")).json() for path in ("/v1/voices", "/v1/audio/voices")]
            deleted = await client.delete(f"{gw.url}/v1/audio/voices/bob")
            after = (await client.get(f"{gw.url}/v1/audio/voices")).json()
            unauthorised = await httpx.AsyncClient().get(f"{gw.url}/v1/audio/voices")
    assert added.status_code == 201 and added.json()["name"] == "bob"
    assert both[0] == both[1] and "bob" in [v["name"] for v in both[0]["data"]]
    assert deleted.status_code == 204 and "bob" not in [v["name"] for v in after["data"]]
    assert unauthorised.status_code == 401
