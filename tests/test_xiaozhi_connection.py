"""The sans-I/O Xiaozhi codec (gateway/xiaozhi/connection.py, messages.py): round trips and wire format."""

import json

import pytest

from gateway.xiaozhi import (
    Abort,
    Alert,
    AudioIn,
    AudioOut,
    AudioParams,
    Event,
    Goodbye,
    Hello,
    Iot,
    Listen,
    ListenMode,
    ListenState,
    LlmEmotion,
    McpMessage,
    Role,
    ServerHello,
    Stt,
    SystemCommand,
    TtsSentenceEnd,
    TtsSentenceStart,
    TtsStart,
    TtsStop,
    UnknownMessage,
    XiaozhiConnection,
)
from tests.xiaozhi_wire_samples import FIRMWARE_MESSAGES, INCUMBENT_MESSAGES, VERSIONS


class DevicePair:
    """A device-role codec wired to a server-role codec: what one sends, the other receives."""

    def __init__(self, binary_version: int = 1, session_id: str = "sess-1") -> None:
        self.device = XiaozhiConnection(Role.DEVICE, binary_version=binary_version)
        self.server = XiaozhiConnection(Role.SERVER, binary_version=binary_version, session_id=session_id)

    @staticmethod
    def _deliver(sender: XiaozhiConnection, receiver: XiaozhiConnection, event: Event) -> Event:
        data = sender.send(event)
        if isinstance(data, bytes):
            return receiver.receive_binary(data)
        return receiver.receive_text(data)

    def device_to_server(self, event: Event) -> Event:
        return self._deliver(self.device, self.server, event)

    def server_to_device(self, event: Event) -> Event:
        return self._deliver(self.server, self.device, event)

    def handshake(self) -> None:
        hello = Hello(version=self.device.binary_version, features={"mcp": True}, audio_params=AudioParams())
        assert self.device_to_server(hello) == hello
        server_hello = ServerHello(
            session_id=self.server.session_id, audio_params=AudioParams(sample_rate=24000)
        )
        assert self.server_to_device(server_hello) == server_hello


DEVICE_EVENTS = [
    Hello(),
    Hello(version=2, transport="websocket", features={"mcp": True, "aec": True}, audio_params=AudioParams()),
    Listen(state=ListenState.START, mode=ListenMode.AUTO),
    Listen(state=ListenState.START, mode=ListenMode.MANUAL),
    Listen(state=ListenState.START, mode=ListenMode.REALTIME),
    Listen(state=ListenState.START),
    Listen(state=ListenState.STOP),
    Listen(state=ListenState.DETECT, text="你好小智"),
    Abort(),
    Abort(reason="wake_word_detected"),
    McpMessage(payload={"jsonrpc": "2.0", "id": 1, "result": {"protocolVersion": "2024-11-05"}}),
    Iot(raw={"update": True, "states": [{"name": "Speaker", "state": {"volume": 80}}]}),
    Goodbye(),
    UnknownMessage(type="custom", raw={"payload": {"x": [1, 2.5, None, "é"]}}),
    UnknownMessage(type="tts", raw={"state": "start"}),  # a server->device type is unknown to a server
]

SERVER_EVENTS = [
    ServerHello(session_id="sess-1", audio_params=AudioParams(sample_rate=24000)),
    ServerHello(session_id="", audio_params=AudioParams(sample_rate=16000, frame_duration=20)),
    TtsStart(),
    TtsSentenceStart(text="今天是晴天，"),
    TtsSentenceEnd(text="今天是晴天，"),
    TtsStop(),
    Stt(text="今天天气怎么样"),
    LlmEmotion(emotion="happy", text="\U0001f642"),
    Alert(status="Warning", message="Battery low", emotion="sad"),
    SystemCommand(command="reboot"),
    McpMessage(payload={"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {"cursor": "x"}}),
    Iot(raw={"commands": [{"name": "Speaker", "method": "SetVolume", "parameters": {"volume": 50}}]}),
    Goodbye(),
    UnknownMessage(type="custom", raw={"payload": {"text": "hi"}}),
    UnknownMessage(type="listen", raw={"state": "start"}),  # a device->server type is unknown to a device
]


# --- DevicePair round trips ----------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("event", DEVICE_EVENTS, ids=repr)
def test_device_events_reach_the_server_unchanged(version, event):
    pair = DevicePair(version)
    pair.handshake()
    assert pair.device_to_server(event) == event


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("event", SERVER_EVENTS, ids=repr)
def test_server_events_reach_the_device_unchanged(version, event):
    pair = DevicePair(version)
    pair.handshake()
    assert pair.server_to_device(event) == event


@pytest.mark.parametrize("version", VERSIONS)
def test_audio_both_ways(version):
    pair = DevicePair(version)
    pair.handshake()
    for size in (0, 1, 3, 120, 1275):
        opus = bytes(range(256)) * (size // 256) + bytes(range(size % 256))
        timestamp = 60 * size if version == 2 else 0  # only v2 carries a timestamp
        assert pair.device_to_server(AudioIn(opus=opus, timestamp_ms=timestamp)) == AudioIn(
            opus=opus, timestamp_ms=timestamp
        )
        assert pair.server_to_device(AudioOut(opus=opus, timestamp_ms=timestamp)) == AudioOut(
            opus=opus, timestamp_ms=timestamp
        )


@pytest.mark.parametrize("version", [1, 3])
def test_versions_without_timestamp_deliver_zero(version):
    pair = DevicePair(version)
    assert pair.server_to_device(AudioOut(opus=b"abc", timestamp_ms=500)) == AudioOut(opus=b"abc")


@pytest.mark.parametrize("version", VERSIONS)
def test_audio_frames_carry_the_negotiated_header(version):
    server = XiaozhiConnection(Role.SERVER, binary_version=version)
    expected = {1: b"abc", 2: b"\x00\x02\x00\x00\x00\x00\x00\x00\x00\x00\x00\x07\x00\x00\x00\x03abc"}
    expected[3] = b"\x00\x00\x00\x03abc"
    assert server.send(AudioOut(opus=b"abc", timestamp_ms=7)) == expected[version]


# --- wire format ---------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_server_hello_json(version):
    server = XiaozhiConnection(Role.SERVER, binary_version=version)
    text = server.send(ServerHello(session_id="2b9f", audio_params=AudioParams(sample_rate=24000)))
    assert text == (
        f'{{"type":"hello","version":{version},"transport":"websocket","session_id":"2b9f",'
        '"audio_params":{"format":"opus","sample_rate":24000,"channels":1,"frame_duration":60}}'
    )


def test_tts_json_with_session_id():
    server = XiaozhiConnection(Role.SERVER, session_id="s1")
    assert server.send(TtsStop()) == '{"type":"tts","state":"stop","session_id":"s1"}'
    assert server.send(TtsStart()) == '{"type":"tts","state":"start","session_id":"s1"}'
    assert (
        server.send(TtsSentenceStart(text="你好。"))
        == '{"type":"tts","state":"sentence_start","text":"你好。","session_id":"s1"}'
    )


def test_server_json_without_session_id_when_unset():
    server = XiaozhiConnection(Role.SERVER)
    assert server.send(Stt(text="hi")) == '{"type":"stt","text":"hi"}'
    assert json.loads(server.send(LlmEmotion(emotion="sad", text="\U0001f614"))) == {
        "type": "llm",
        "text": "\U0001f614",
        "emotion": "sad",
    }


def test_non_ascii_is_sent_as_is():
    server = XiaozhiConnection(Role.SERVER)
    assert "今天" in server.send(Stt(text="今天"))


def test_server_adopts_the_session_id_of_its_hello():
    server = XiaozhiConnection(Role.SERVER)
    server.send(ServerHello(session_id="new-id"))
    assert server.session_id == "new-id"
    assert json.loads(server.send(TtsStop()))["session_id"] == "new-id"


def test_device_messages_carry_session_id_first_except_hello():
    device = XiaozhiConnection(Role.DEVICE)
    assert device.send(Listen(state=ListenState.STOP)) == '{"session_id":"","type":"listen","state":"stop"}'
    device.session_id = "abc"
    assert device.send(Abort()) == '{"session_id":"abc","type":"abort"}'
    assert "session_id" not in json.loads(device.send(Hello()))


def test_device_hello_matches_firmware():
    device = XiaozhiConnection(Role.DEVICE)
    text = device.send(Hello(features={"mcp": True}, audio_params=AudioParams()))
    assert text == (
        '{"type":"hello","version":1,"features":{"mcp":true},"transport":"websocket",'
        '"audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60}}'
    )


def test_device_learns_session_id_from_server_hello():
    device = XiaozhiConnection(Role.DEVICE)
    device.receive_text('{"type":"hello","transport":"websocket","session_id":"2b9f"}')
    assert device.session_id == "2b9f"
    device.receive_text('{"type":"hello","transport":"websocket"}')  # absent: keep the old one
    assert device.session_id == "2b9f"
    assert json.loads(device.send(Listen(state=ListenState.START)))["session_id"] == "2b9f"


# --- parsing what real peers send ----------------------------------------------------------

# (the messages and their events are in tests/xiaozhi_wire_samples.py)


@pytest.mark.parametrize(("text", "event"), FIRMWARE_MESSAGES)
def test_server_parses_device_messages(text, event):
    assert XiaozhiConnection(Role.SERVER).receive_text(text) == event


@pytest.mark.parametrize(("text", "event"), INCUMBENT_MESSAGES)
def test_device_parses_server_messages(text, event):
    assert XiaozhiConnection(Role.DEVICE).receive_text(text) == event
