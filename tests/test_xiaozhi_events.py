"""Event construction and validation (gateway/xiaozhi/events.py)."""

import dataclasses

import pytest

from gateway.xiaozhi.errors import LocalProtocolError, ProtocolError
from gateway.xiaozhi.events import (
    Abort,
    Alert,
    AudioIn,
    AudioOut,
    AudioParams,
    Goodbye,
    Hello,
    Iot,
    Listen,
    ListenMode,
    ListenState,
    LlmEmotion,
    McpMessage,
    ServerHello,
    Stt,
    SystemCommand,
    TtsSentenceEnd,
    TtsSentenceStart,
    TtsStart,
    TtsStop,
    UnknownMessage,
)


def test_defaults():
    assert AudioParams() == AudioParams(format="opus", sample_rate=16000, channels=1, frame_duration=60)
    hello = Hello()
    assert (hello.version, hello.transport, hello.features, hello.audio_params) == (1, "websocket", {}, None)
    assert Listen(state=ListenState.START) == Listen(state=ListenState.START, mode=None, text=None)
    assert Abort().reason is None
    assert AudioIn(opus=b"x").timestamp_ms == 0
    assert AudioOut(opus=b"x").timestamp_ms == 0
    assert LlmEmotion(emotion="happy").text == ""
    assert ServerHello(session_id="s").audio_params.sample_rate == 24000


def test_feature_dicts_are_not_shared_between_instances():
    assert Hello().features is not Hello().features


def test_enum_values_are_the_wire_strings():
    assert [s.value for s in ListenState] == ["start", "stop", "detect"]
    assert [m.value for m in ListenMode] == ["auto", "manual", "realtime"]
    assert ListenState("detect") is ListenState.DETECT


def test_events_are_immutable():
    event = Stt(text="hi")
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.text = "other"  # type: ignore[misc]


def test_events_are_keyword_only():
    with pytest.raises(TypeError):
        Stt("hi")  # type: ignore[misc]


def test_events_compare_by_value():
    assert Listen(state=ListenState.START, mode=ListenMode.AUTO) == Listen(
        state=ListenState.START, mode=ListenMode.AUTO
    )
    assert TtsStart() != TtsStop()
    assert AudioIn(opus=b"a") != AudioOut(opus=b"a")


INVALID = [
    lambda: AudioParams(sample_rate="16000"),
    lambda: AudioParams(sample_rate=0),
    lambda: AudioParams(channels=True),
    lambda: AudioParams(frame_duration=-60),
    lambda: AudioParams(format=None),
    lambda: Hello(version="1"),
    lambda: Hello(version=-1),
    lambda: Hello(transport=1),
    lambda: Hello(features=[]),
    lambda: Hello(audio_params={"format": "opus"}),
    lambda: Listen(state="start"),
    lambda: Listen(state=ListenState.START, mode="auto"),
    lambda: Listen(state=ListenState.DETECT, text=b"hi"),
    lambda: Abort(reason=1),
    lambda: AudioIn(opus="abc"),
    lambda: AudioIn(opus=bytearray(b"abc")),
    lambda: AudioIn(opus=b"", timestamp_ms=-1),
    lambda: AudioIn(opus=b"", timestamp_ms=2**32),
    lambda: AudioOut(opus=b"", timestamp_ms=1.0),
    lambda: McpMessage(payload=[]),
    lambda: McpMessage(payload='{"jsonrpc":"2.0"}'),
    lambda: Iot(raw={"type": "iot"}),
    lambda: Iot(raw={"session_id": "x"}),
    lambda: Iot(raw=None),
    lambda: UnknownMessage(type=None, raw={}),
    lambda: UnknownMessage(type="custom", raw={"type": "custom"}),
    lambda: ServerHello(session_id=None),
    lambda: ServerHello(session_id="s", audio_params=AudioParams(sample_rate=22050)),
    lambda: ServerHello(session_id="s", audio_params=AudioParams(frame_duration=30)),
    lambda: ServerHello(session_id="s", audio_params={"sample_rate": 24000}),
    lambda: TtsSentenceStart(text=None),
    lambda: TtsSentenceEnd(text=3),
    lambda: Stt(text=["a"]),
    lambda: LlmEmotion(emotion="joyful"),
    lambda: LlmEmotion(emotion="happy", text=None),
    lambda: LlmEmotion(emotion="\U0001f642"),
    lambda: Alert(status="Warning", message="Battery low", emotion=None),
    lambda: SystemCommand(command=None),
]


@pytest.mark.parametrize("make", INVALID)
def test_invalid_fields_raise_local_protocol_error(make):
    with pytest.raises(LocalProtocolError) as info:
        make()
    assert isinstance(info.value, ProtocolError)
    assert info.value.close_code_hint == 1011


VALID = [
    lambda: Hello(version=3, features={"mcp": True, "aec": True}, audio_params=AudioParams()),
    lambda: Listen(state=ListenState.DETECT, text="你好小智"),
    lambda: Listen(state=ListenState.START, mode=ListenMode.REALTIME),
    lambda: Abort(reason="wake_word_detected"),
    lambda: AudioIn(opus=b"", timestamp_ms=2**32 - 1),
    lambda: McpMessage(payload={"jsonrpc": "2.0", "id": 1, "result": {}}),
    lambda: Iot(raw={"update": True, "states": []}),
    lambda: Goodbye(),
    lambda: UnknownMessage(type="custom", raw={"payload": {"a": 1}}),
    lambda: ServerHello(session_id="", audio_params=AudioParams(sample_rate=48000, frame_duration=120)),
    lambda: Alert(status="Warning", message="Battery low", emotion="sad"),
    lambda: SystemCommand(command="reboot"),
]


@pytest.mark.parametrize("make", VALID)
def test_valid_events_construct(make):
    event = make()
    assert dataclasses.replace(event) == event
