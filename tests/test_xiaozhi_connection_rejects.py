"""The sans-I/O Xiaozhi codec's rejected input (RemoteProtocolError) and API misuse (LocalProtocolError)."""

import json

import pytest

from gateway.xiaozhi import (
    Abort,
    AudioIn,
    AudioOut,
    Hello,
    Listen,
    ListenState,
    LocalProtocolError,
    McpMessage,
    RemoteProtocolError,
    Role,
    ServerHello,
    Stt,
    TtsStart,
    UnknownMessage,
    XiaozhiConnection,
)

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
