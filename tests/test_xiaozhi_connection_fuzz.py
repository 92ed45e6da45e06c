"""Fuzzing the sans-I/O Xiaozhi codec: every input ends in an event or RemoteProtocolError."""

import json
import random
import typing

import pytest

from gateway.xiaozhi import (
    AudioIn,
    AudioOut,
    Event,
    Listen,
    McpMessage,
    RemoteProtocolError,
    Role,
    XiaozhiConnection,
)
from tests.xiaozhi_wire_samples import FIRMWARE_MESSAGES, INCUMBENT_MESSAGES, VERSIONS

EVENT_TYPES = typing.get_args(Event)


# --- fuzz: every input ends in an event or RemoteProtocolError -----------------------------


def _random_json(rng: random.Random, depth: int = 0):
    kinds = ["null", "bool", "int", "float", "str"] + (["list", "dict"] if depth < 3 else [])
    kind = rng.choice(kinds)
    if kind == "null":
        return None
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "int":
        return rng.choice([0, 1, 2, 3, -1, 60, 16000, 24000, 2**40, rng.randrange(-1000, 1000)])
    if kind == "float":
        return rng.choice([0.0, 1.0, 1.5, 16000.0, 1e300, -2.5])
    if kind == "str":
        return rng.choice(
            ["", "start", "stop", "detect", "auto", "websocket", "happy", "你好", "\U0001f642", "x" * 50]
        )
    if kind == "list":
        return [_random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(FIELD_NAMES): _random_json(rng, depth + 1) for _ in range(rng.randrange(5))}


FIELD_NAMES = [
    "type", "session_id", "version", "transport", "features", "audio_params", "sample_rate",
    "frame_duration", "channels", "format", "state", "mode", "text", "reason", "payload", "emotion",
    "status", "message", "command",
]  # fmt: skip

SAMPLE_TEXTS = [text for text, _ in FIRMWARE_MESSAGES + INCUMBENT_MESSAGES]


def _random_message(rng: random.Random) -> str:
    choice = rng.random()
    if choice < 0.35:  # a real message with one field replaced or removed
        msg = json.loads(rng.choice(SAMPLE_TEXTS))
        key = rng.choice([*msg, *FIELD_NAMES])
        if rng.random() < 0.3:
            msg.pop(key, None)
        else:
            msg[key] = _random_json(rng)
        return json.dumps(msg, ensure_ascii=rng.random() < 0.5)
    if choice < 0.6:  # any JSON value
        return json.dumps(_random_json(rng))
    if choice < 0.85:  # a real message cut short
        text = rng.choice(SAMPLE_TEXTS)
        return text[: rng.randrange(len(text) + 1)]
    return rng.randbytes(rng.randrange(30)).decode("utf-8", "surrogateescape")


def _assert_event_or_remote_error(call, data) -> Event | None:
    try:
        event = call(data)
    except RemoteProtocolError:
        return None
    assert isinstance(event, EVENT_TYPES)
    return event


@pytest.mark.parametrize("role", list(Role))
def test_fuzz_text(role):
    rng = random.Random(2026 if role is Role.SERVER else 7)
    receiver = XiaozhiConnection(role)
    # Whatever one side parsed, the other side's role can send again, and it parses the same.
    sender = XiaozhiConnection(Role.DEVICE if role is Role.SERVER else Role.SERVER)
    parsed = 0
    for _ in range(4000):
        event = _assert_event_or_remote_error(receiver.receive_text, _random_message(rng))
        if event is None:
            continue
        parsed += 1
        assert receiver.receive_text(sender.send(event)) == event
    assert 200 < parsed < 3900  # both outcomes are exercised


@pytest.mark.parametrize("role", list(Role))
@pytest.mark.parametrize("version", VERSIONS)
def test_fuzz_binary(role, version):
    rng = random.Random(version * 10 + (role is Role.SERVER))
    receiver = XiaozhiConnection(role, binary_version=version, max_binary_bytes=64)
    sender = XiaozhiConnection(Role.DEVICE if role is Role.SERVER else Role.SERVER, binary_version=version)
    audio_class = AudioIn if role is Role.SERVER else AudioOut
    for _ in range(2000):
        if rng.random() < 0.5:
            data = rng.randbytes(rng.randrange(80))
        else:
            data = sender.send(
                audio_class(opus=rng.randbytes(rng.randrange(60)), timestamp_ms=rng.randrange(2**32))
            )
            data = data[: rng.randrange(len(data) + 1)] + rng.randbytes(rng.randrange(3))
        event = _assert_event_or_remote_error(receiver.receive_binary, data)
        assert event is None or type(event) is audio_class


def test_lone_surrogates_from_the_device_become_replacement_characters():
    # JSON may escape a lone surrogate; such a str cannot be encoded as UTF-8 again (stt echo, LLM).
    conn = XiaozhiConnection(Role.SERVER)
    event = conn.receive_text('{"type":"listen","state":"detect","text":"\\ud800 hi \\ud83d\\ude00 \\udfff"}')
    assert isinstance(event, Listen) and event.text == "\ufffd hi \U0001f600 \ufffd"
    event.text.encode("utf-8")
    mcp = conn.receive_text('{"type":"mcp","payload":{"a\\udc00":[{"b":["\\ud800"]}],"c":"\\\\ud800"}}')
    assert isinstance(mcp, McpMessage)
    assert mcp.payload == {"a\ufffd": [{"b": ["\ufffd"]}], "c": "\\ud800"}
