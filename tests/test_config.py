from pathlib import Path
from typing import get_args, get_origin

import pytest
from pydantic import BaseModel

from gateway.config import Config, ConfigError, load_config


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


# ---- list keys from the environment: one rule for all of them ----------------------------------


def config_keys(wanted, model: type[BaseModel] = Config, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every key of the config model whose type ``wanted(annotation)`` accepts (new keys are covered)."""
    keys = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            keys += config_keys(wanted, annotation, (*prefix, name))
        elif wanted(annotation):
            keys.append((*prefix, name))
    return keys


def list_keys() -> list[tuple[str, ...]]:
    """Every list-of-strings key."""
    return config_keys(lambda a: get_origin(a) is list and get_args(a) == (str,))


def value_at(cfg: Config, key: tuple[str, ...]):
    node = cfg
    for part in key:
        node = getattr(node, part)
    return node


def env_name(key: tuple[str, ...]) -> str:
    return "XZ_" + "__".join(part.upper() for part in key)


def test_the_list_keys_are_found():
    found = set(list_keys())
    expected = {("server", "auth", "tokens"), ("server", "auth", "allowed_devices"), ("api", "api_keys"),
                ("session", "wake_words"), ("session", "exit_commands")}  # fmt: skip
    assert expected <= found


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("tok-abc", ["tok-abc"]),  # one entry (it used to stop the server for server.auth.tokens)
        ("k1,k2", ["k1", "k2"]),
        (" k1 , k2,,  ,k3 ", ["k1", "k2", "k3"]),  # entries stripped, empty ones dropped
        ("0123", ["0123"]),  # as written, not a YAML number
        ("yes,no,null", ["yes", "no", "null"]),  # not YAML booleans or null
        ("小智,你好小智", ["小智", "你好小智"]),
        ('["a,b", "c"]', ["a,b", "c"]),  # a JSON list, for entries that hold a comma
        ("[x, ' y ', '']", ["x", "y"]),  # a YAML flow list
        ("[]", []),
        ("", []),
    ],
)
@pytest.mark.parametrize("key", list_keys(), ids=".".join)
def test_every_list_key_is_settable_from_the_environment_both_ways(key, raw, expected):
    assert value_at(load_config(environ={env_name(key): raw}), key) == expected


@pytest.mark.parametrize("key", list_keys(), ids=".".join)
def test_a_config_file_string_for_a_list_key_follows_the_same_rule(key, tmp_path: Path):
    path = tmp_path / "c.yaml"
    section, *rest = key
    nested = f"{rest[-1]}: 'a, b,,'"
    for part in reversed([section, *rest[:-1]]):
        nested = f"{part}:\n" + "\n".join("  " + line for line in nested.splitlines())
    path.write_text(nested + "\n")
    assert value_at(load_config(path, environ={}), key) == ["a", "b"]


def test_a_malformed_list_from_the_environment_names_the_variable():
    with pytest.raises(ConfigError, match="XZ_SERVER__AUTH__TOKENS"):
        load_config(environ={"XZ_SERVER__AUTH__TOKENS": "[a, b"})


# ---- string keys from the environment: taken as written -------------------------------------


def text_keys() -> list[tuple[str, ...]]:
    """Every plain string key (`str`, `str | None`)."""
    return config_keys(lambda a: a is str or (bool(get_args(a)) and set(get_args(a)) == {str, type(None)}))


def test_string_keys_are_found():
    assert {("llm", "api_key"), ("llm", "model"), ("server", "public_ws_url")} <= set(text_keys())


@pytest.mark.parametrize("raw", ["0123", "true", "1e3", "null", "[a]", "k: v"])
def test_a_string_key_from_the_environment_is_taken_as_written(raw):
    # `XZ_LLM__API_KEY=0123` used to become the number 123 and stop the server.
    assert load_config(environ={"XZ_LLM__API_KEY": raw}).llm.api_key == raw


@pytest.mark.parametrize("key", text_keys(), ids=".".join)
def test_every_string_key_takes_a_numeric_looking_value_verbatim(key):
    # Digits that would be a YAML number; keys with a format of their own get a long digit string
    # (the secret's minimum length) or are checked by their own pattern, never as a type error.
    raw = "1234567890123456789"
    try:
        cfg = load_config(environ={env_name(key): raw})
    except ConfigError as exc:
        assert "should match pattern" in str(exc) and ".".join(key) in str(exc)
        return
    assert value_at(cfg, key) == raw
