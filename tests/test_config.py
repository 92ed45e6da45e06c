from pathlib import Path

import pytest

from gateway.config import ConfigError, load_config


def test_defaults_from_the_project_config_file():
    cfg = load_config(environ={})
    assert cfg.audio.output_sample_rate == 16000
    assert cfg.llm.provider == "echo"
    assert "你好小智" in cfg.session.wake_words


def test_env_overrides_single_keys_with_yaml_scalars():
    cfg = load_config(
        environ={
            "XZ_AUDIO__OUTPUT_SAMPLE_RATE": "24000",
            "XZ_SERVER__AUTH__ENABLED": "true",
            "XZ_SERVER__AUTH__TOKENS": "[abc, def]",
            "XZ_LLM__API_KEY": "sk-test",
            "UNRELATED": "1",
        }
    )
    assert cfg.audio.output_sample_rate == 24000
    assert cfg.server.auth.enabled is True
    assert cfg.server.auth.tokens == ["abc", "def"]
    assert cfg.llm.api_key == "sk-test"


def test_other_file_and_explicit_overrides(tmp_path: Path):
    path = tmp_path / "c.yaml"
    path.write_text("server:\n  port: 9001\naudio:\n  prebuffer_frames: 3\n")
    cfg = load_config(path, environ={"XZ_SERVER__PORT": "9002"}, overrides={"audio": {"prebuffer_frames": 4}})
    assert cfg.server.port == 9002
    assert cfg.audio.prebuffer_frames == 4


@pytest.mark.parametrize(
    ("env", "key"),
    [
        ({"XZ_AUDIO__OUTPUT_SAMPLE_RATE": "44100"}, "audio.output_sample_rate"),
        ({"XZ_SERVER__PORT": "-1"}, "server.port"),
        ({"XZ_AUDIO__NO_SUCH_KEY": "1"}, "audio.no_such_key"),
        ({"XZ_TTS__BACKEND": "nonsense"}, "tts.backend"),
    ],
)
def test_bad_values_name_the_key(env, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(environ=env)


def test_missing_and_malformed_files(tmp_path: Path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml", environ={})
    bad = tmp_path / "bad.yaml"
    bad.write_text("server: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad, environ={})
