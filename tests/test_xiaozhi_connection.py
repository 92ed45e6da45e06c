"""The sans-I/O Xiaozhi codec (gateway/xiaozhi/connection.py and messages.py)."""

import json
import random
import typing

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
    LocalProtocolError,
    McpMessage,
    RemoteProtocolError,
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

VERSIONS = [1, 2, 3]
EVENT_TYPES = typing.get_args(Event)


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

FIRMWARE_MESSAGES = [
    (
        '{"type":"hello","version":1,"features":{"mcp":true,"glyph_push":false},"transport":"websocket",'
        '"audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60}}',
        Hello(features={"mcp": True, "glyph_push": False}, audio_params=AudioParams()),
    ),
    ('{"type":"hello","version":1,"transport":"websocket"}', Hello()),  # old firmware, no features
    ('{"type":"hello"}', Hello()),
    (
        '{"session_id":"x","type":"listen","state":"start","mode":"auto"}',
        Listen(state=ListenState.START, mode=ListenMode.AUTO),
    ),
    ('{"session_id":"x","type":"listen","state":"start"}', Listen(state=ListenState.START)),
    ('{"session_id":"x","type":"listen","state":"stop"}', Listen(state=ListenState.STOP)),
    (
        '{"session_id":"x","type":"listen","state":"detect","text":"你好小智"}',
        Listen(state=ListenState.DETECT, text="你好小智"),
    ),
    ('{"session_id":"x","type":"listen","state":"detect"}', Listen(state=ListenState.DETECT, text="")),
    ('{"session_id":"x","type":"abort"}', Abort()),
    ('{"session_id":"x","type":"abort","reason":"wake_word_detected"}', Abort(reason="wake_word_detected")),
    ('{"session_id":"x","type":"abort","reason":null}', Abort()),
    (
        '{"session_id":"x","type":"mcp","payload":{"jsonrpc":"2.0","method":"notifications/x"}}',
        McpMessage(payload={"jsonrpc": "2.0", "method": "notifications/x"}),
    ),
    (
        '{"session_id":"x","type":"iot","update":true,"descriptors":[]}',
        Iot(raw={"update": True, "descriptors": []}),
    ),
    ('{"session_id":"x","type":"goodbye"}', Goodbye()),
    ('{"session_id":"x","type":"ping","n":1}', UnknownMessage(type="ping", raw={"n": 1})),
    ('{"type":"tts","state":"start"}', UnknownMessage(type="tts", raw={"state": "start"})),
    (
        '{"type":"hello","version":2.0,"audio_params":{"sample_rate":16000.0},"extra":1}',
        Hello(version=2, audio_params=AudioParams()),
    ),
]


@pytest.mark.parametrize(("text", "event"), FIRMWARE_MESSAGES)
def test_server_parses_device_messages(text, event):
    assert XiaozhiConnection(Role.SERVER).receive_text(text) == event


INCUMBENT_MESSAGES = [
    (
        '{"type":"hello","version":1,"transport":"websocket","session_id":"2b9f",'
        '"audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60}}',
        ServerHello(session_id="2b9f", audio_params=AudioParams()),
    ),
    (
        '{"type":"hello","transport":"websocket"}',
        ServerHello(session_id="", audio_params=AudioParams(sample_rate=24000)),
    ),
    (
        '{"type":"hello","transport":"websocket","audio_params":{"sample_rate":48000}}',
        ServerHello(session_id="", audio_params=AudioParams(sample_rate=48000)),
    ),
    ('{"session_id":"x","type":"tts","state":"start"}', TtsStart()),
    ('{"session_id":"x","type":"tts","state":"sentence_start","text":"晴天"}', TtsSentenceStart(text="晴天")),
    ('{"session_id":"x","type":"tts","state":"sentence_end","text":"晴天"}', TtsSentenceEnd(text="晴天")),
    ('{"session_id":"x","type":"tts","state":"stop"}', TtsStop()),
    ('{"session_id":"x","type":"stt","text":"今天天气怎么样"}', Stt(text="今天天气怎么样")),
    ('{"session_id":"x","type":"llm","text":"😊","emotion":"happy"}', LlmEmotion(emotion="happy", text="😊")),
    ('{"type":"llm","emotion":"cool"}', LlmEmotion(emotion="cool")),
    ('{"type":"system","command":"reboot"}', SystemCommand(command="reboot")),
    (
        '{"type":"alert","status":"Warning","message":"Battery low","emotion":"sad"}',
        Alert(status="Warning", message="Battery low", emotion="sad"),
    ),
    ('{"type":"custom","payload":{"a":1}}', UnknownMessage(type="custom", raw={"payload": {"a": 1}})),
    ('{"type":"abort"}', UnknownMessage(type="abort", raw={})),
]


@pytest.mark.parametrize(("text", "event"), INCUMBENT_MESSAGES)
def test_device_parses_server_messages(text, event):
    assert XiaozhiConnection(Role.DEVICE).receive_text(text) == event


# --- rejected input ------------------------------------------------------------------------

BAD_FOR_SERVER = [
    "",
    "not json",
    '{"type":"listen"',
    "[]",
    '"hello"',
    "42",
    "null",
    "{}",
    '{"type":null}',
    '{"type":5}',
    '{"type":["hello"]}',
    '{"type":"hello","version":"1"}',
    '{"type":"hello","version":true}',
    '{"type":"hello","version":1.5}',
    '{"type":"hello","features":[]}',
    '{"type":"hello","transport":1}',
    '{"type":"hello","audio_params":"opus"}',
    '{"type":"hello","audio_params":{"sample_rate":"16000"}}',
    '{"type":"hello","audio_params":{"sample_rate":0}}',
    '{"type":"listen"}',
    '{"type":"listen","state":"pause"}',
    '{"type":"listen","state":1}',
    '{"type":"listen","state":"start","mode":"shout"}',
    '{"type":"listen","state":"detect","text":5}',
    '{"type":"abort","reason":{}}',
    '{"type":"mcp"}',
    '{"type":"mcp","payload":[1]}',
    '{"type":"mcp","payload":{"x":NaN}}',
    '{"type":"mcp","payload":{"x":Infinity}}',
    '{"type":"mcp","payload":{"x":1e999}}',
    "[" * 100_000 + "]" * 100_000,
]


@pytest.mark.parametrize("text", BAD_FOR_SERVER, ids=lambda t: t[:40])
def test_server_rejects_malformed_text(text):
    server = XiaozhiConnection(Role.SERVER, max_text_bytes=1_000_000)
    with pytest.raises(RemoteProtocolError) as info:
        server.receive_text(text)
    assert info.value.close_code_hint == 1007


BAD_FOR_DEVICE = [
    '{"type":"hello"}',  # no transport: the firmware would fail
    '{"type":"hello","transport":"udp"}',
    '{"type":"hello","transport":"websocket","session_id":5}',
    '{"type":"hello","transport":"websocket","audio_params":{"sample_rate":44100}}',
    '{"type":"hello","transport":"websocket","audio_params":{"frame_duration":"60"}}',
    '{"type":"tts"}',
    '{"type":"tts","state":"pause"}',
    '{"type":"tts","state":"sentence_start"}',
    '{"type":"stt"}',
    '{"type":"stt","text":1}',
    '{"type":"llm","text":"x"}',
    '{"type":"llm","emotion":"ecstatic"}',
    '{"type":"alert","status":"Warning","message":"Battery low"}',
    '{"type":"system"}',
    '{"type":"mcp","payload":"{}"}',
]


@pytest.mark.parametrize("text", BAD_FOR_DEVICE)
def test_device_rejects_malformed_text(text):
    with pytest.raises(RemoteProtocolError):
        XiaozhiConnection(Role.DEVICE).receive_text(text)


def test_text_size_limit_counts_utf8_bytes():
    server = XiaozhiConnection(Role.SERVER, max_text_bytes=100)
    fits = json.dumps({"type": "stt", "text": "x" * 70})
    assert len(fits.encode()) <= 100
    assert server.receive_text(fits) == UnknownMessage(type="stt", raw={"text": "x" * 70})
    too_big = json.dumps({"type": "listen", "state": "detect", "text": "你" * 30}, ensure_ascii=False)
    assert len(too_big) <= 100 < len(too_big.encode())
    with pytest.raises(RemoteProtocolError) as info:
        server.receive_text(too_big)
    assert info.value.close_code_hint == 1009


def test_binary_size_limit():
    server = XiaozhiConnection(Role.SERVER, binary_version=1, max_binary_bytes=10)
    assert server.receive_binary(bytes(10)) == AudioIn(opus=bytes(10))
    with pytest.raises(RemoteProtocolError) as info:
        server.receive_binary(bytes(11))
    assert info.value.close_code_hint == 1009


def test_default_binary_limit_fits_the_largest_v2_frame_of_a_device():
    server = XiaozhiConnection(Role.SERVER, binary_version=2)
    frame = XiaozhiConnection(Role.DEVICE, binary_version=2).send(AudioIn(opus=bytes(65535)))
    assert server.receive_binary(frame) == AudioIn(opus=bytes(65535))
    with pytest.raises(RemoteProtocolError):
        server.receive_binary(frame + b"\x00")


def test_empty_v1_frame_is_an_empty_packet():
    assert XiaozhiConnection(Role.SERVER).receive_binary(b"") == AudioIn(opus=b"")


@pytest.mark.parametrize("version", [2, 3])
def test_truncated_frames_are_rejected(version):
    server = XiaozhiConnection(Role.SERVER, binary_version=version)
    frame = XiaozhiConnection(Role.DEVICE, binary_version=version).send(AudioIn(opus=b"abcdef"))
    for cut in range(len(frame)):
        with pytest.raises(RemoteProtocolError):
            server.receive_binary(frame[:cut])


# --- API misuse ----------------------------------------------------------------------------


@pytest.mark.parametrize("event", [Listen(state=ListenState.START), Hello(), Abort(), AudioIn(opus=b"")])
def test_server_cannot_send_device_events(event):
    with pytest.raises(LocalProtocolError):
        XiaozhiConnection(Role.SERVER).send(event)


@pytest.mark.parametrize("event", [TtsStart(), ServerHello(session_id="s"), Stt(text=""), AudioOut(opus=b"")])
def test_device_cannot_send_server_events(event):
    with pytest.raises(LocalProtocolError):
        XiaozhiConnection(Role.DEVICE).send(event)


def test_unknown_message_must_not_shadow_a_known_type():
    with pytest.raises(LocalProtocolError):
        XiaozhiConnection(Role.SERVER).send(UnknownMessage(type="tts", raw={"state": "stop"}))
    with pytest.raises(LocalProtocolError):
        XiaozhiConnection(Role.DEVICE).send(UnknownMessage(type="listen", raw={"state": "stop"}))


@pytest.mark.parametrize("payload", [{"x": object()}, {"x": float("nan")}, {"x": b"bytes"}])
def test_payload_that_is_not_json_is_a_local_error(payload):
    with pytest.raises(LocalProtocolError):
        XiaozhiConnection(Role.SERVER).send(McpMessage(payload=payload))


def test_sending_something_that_is_not_an_event():
    with pytest.raises(LocalProtocolError):
        XiaozhiConnection(Role.SERVER).send({"type": "tts", "state": "stop"})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"role": "server"},
        {"role": Role.SERVER, "binary_version": 4},
        {"role": Role.SERVER, "binary_version": "2"},
        {"role": Role.SERVER, "session_id": None},
        {"role": Role.SERVER, "max_text_bytes": 0},
        {"role": Role.SERVER, "max_binary_bytes": 1.5},
    ],
)
def test_bad_constructor_arguments(kwargs):
    with pytest.raises(LocalProtocolError):
        XiaozhiConnection(**kwargs)


def test_binary_version_is_fixed():
    connection = XiaozhiConnection(Role.SERVER, binary_version=3)
    with pytest.raises(AttributeError):
        connection.binary_version = 1  # type: ignore[misc]


def test_receive_with_wrong_python_types():
    server = XiaozhiConnection(Role.SERVER)
    with pytest.raises(LocalProtocolError):
        server.receive_text(b'{"type":"abort"}')  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError):
        server.receive_binary("abc")  # type: ignore[arg-type]


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
