"""Reading the device's WebSocket upgrade request (docs/xiaozhi-protocol.md section 2.1)."""

import pytest
from starlette.datastructures import Headers as StarletteHeaders
from starlette.datastructures import QueryParams
from websockets.datastructures import Headers as WebsocketsHeaders

from gateway.xiaozhi.errors import LocalProtocolError, RemoteProtocolError
from gateway.xiaozhi.handshake import HandshakeInfo, parse_handshake

MAC = "d8:3b:da:4e:12:34"
UUID = "3f0c9a52-7a1e-4c1b-9d55-0d3b2a1f6e77"

FIRMWARE_HEADERS = {
    "Host": "192.168.1.10:8000",
    "Upgrade": "websocket",
    "Connection": "Upgrade",
    "Sec-WebSocket-Version": "13",
    "Authorization": "Bearer tok123",
    "Protocol-Version": "1",
    "Device-Id": MAC,
    "Client-Id": UUID,
}


def test_firmware_headers():
    assert parse_handshake(FIRMWARE_HEADERS, {}) == HandshakeInfo(
        device_id=MAC, client_id=UUID, token="tok123", protocol_version=1
    )


@pytest.mark.parametrize("transform", [str.lower, str.upper, str.title])
def test_header_names_are_case_insensitive(transform):
    headers = {transform(name): value for name, value in FIRMWARE_HEADERS.items()}
    headers[transform("Protocol-Version")] = "3"
    assert parse_handshake(headers, {}) == HandshakeInfo(MAC, UUID, "tok123", 3)


@pytest.mark.parametrize(
    ("authorization", "token"),
    [
        ("Bearer abc", "abc"),
        ("bearer abc", "abc"),
        ("BEARER  abc ", "abc"),
        ("Bearer a.b-c_d==", "a.b-c_d=="),
        ("abc", "abc"),  # no scheme: verbatim
        ("Token abc def", "Token abc def"),  # a token with a space is sent verbatim by the firmware
        ("Bearerabc", "Bearerabc"),
        ("Bearer ", None),
        ("Bearer", None),
        ("", None),
        ("   ", None),
    ],
)
def test_authorization_header(authorization, token):
    assert parse_handshake({"Authorization": authorization}, {}).token == token


def test_missing_everything_gives_none_and_version_1():
    assert parse_handshake({}, {}) == HandshakeInfo(None, None, None, 1)


def test_query_fallback_for_browser_clients():
    query = {"device-id": MAC, "client-id": UUID, "authorization": "Bearer web-token"}
    assert parse_handshake({}, query) == HandshakeInfo(MAC, UUID, "web-token", 1)


def test_header_wins_over_query():
    query = {"device-id": "aa:aa", "client-id": "q-client", "authorization": "Bearer q", "version": "3"}
    assert parse_handshake(FIRMWARE_HEADERS, query) == HandshakeInfo(MAC, UUID, "tok123", 1)


def test_each_missing_header_falls_back_separately():
    info = parse_handshake({"Device-Id": MAC}, {"client-id": "q-client", "authorization": "q"})
    assert info == HandshakeInfo(MAC, "q-client", "q", 1)


def test_empty_header_value_falls_back_to_query():
    assert parse_handshake({"Device-Id": " "}, {"device-id": MAC}).device_id == MAC


@pytest.mark.parametrize(
    ("headers", "query", "version"),
    [
        ({}, {}, 1),
        ({"Protocol-Version": "1"}, {}, 1),
        ({"Protocol-Version": "2"}, {}, 2),
        ({"protocol-version": " 3 "}, {}, 3),
        ({"Protocol-Version": ""}, {}, 1),
        ({}, {"protocol-version": "2"}, 2),
        ({}, {"version": "3"}, 3),
        ({}, {"protocol-version": "2", "version": "3"}, 2),
        ({"Protocol-Version": "3"}, {"protocol-version": "2", "version": "2"}, 3),
    ],
)
def test_protocol_version(headers, query, version):
    assert parse_handshake(headers, query).protocol_version == version


@pytest.mark.parametrize("value", ["0", "4", "-1", "+2", "2.0", "v2", "abc", "99999999999999999999", "２"])
@pytest.mark.parametrize("where", ["header", "query", "query-version"])
def test_invalid_protocol_version_is_a_remote_error(value, where):
    headers = {"Protocol-Version": value} if where == "header" else {}
    query = {"protocol-version": value} if where == "query" else {}
    if where == "query-version":
        query = {"version": value}
    with pytest.raises(RemoteProtocolError):
        parse_handshake(headers, query)


def test_non_string_values_are_a_local_error():
    with pytest.raises(LocalProtocolError):
        parse_handshake({"Protocol-Version": 2}, {})  # type: ignore[dict-item]
    with pytest.raises(LocalProtocolError):
        parse_handshake({}, {"device-id": None})  # type: ignore[dict-item]


def test_starlette_headers_and_query_params():
    headers = StarletteHeaders(
        raw=[(b"device-id", MAC.encode()), (b"protocol-version", b"2"), (b"authorization", b"Bearer t")]
    )
    query = QueryParams("client-id=" + UUID + "&authorization=Bearer%20other")
    assert parse_handshake(headers, query) == HandshakeInfo(MAC, UUID, "t", 2)


def test_websockets_headers_with_a_repeated_name():
    headers = WebsocketsHeaders([("Device-Id", MAC), ("device-id", "other"), ("Protocol-Version", "3")])
    assert parse_handshake(headers, {}) == HandshakeInfo(MAC, None, None, 3)
