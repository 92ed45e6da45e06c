import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from gateway.llm import ChatLLM, LLMError, OpenAIChatLLM

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "你好"}]
SSE = {"content-type": "text/event-stream"}


def chunk(content: str | None = None, **delta: object) -> bytes:
    if content is not None:
        delta["content"] = content
    body = {"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}]}
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n".encode()


DONE = b"data: [DONE]\n\n"


def make_llm(handler, **kwargs) -> OpenAIChatLLM:
    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    options = {"base_url": "http://llm.test/v1", "api_key": "sk-test", "model": "test-model"}
    return OpenAIChatLLM(**(options | kwargs), client=client)


def sse_handler(*parts: bytes, status: int = 200, headers: dict[str, str] | None = None):
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, headers=headers or SSE, content=b"".join(parts))

    return handler


async def collect(llm: OpenAIChatLLM, messages=MESSAGES) -> list[str]:
    return [delta async for delta in llm.stream_chat(messages)]


async def test_normal_stream_and_request_shape():
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        parts = [chunk(role="assistant"), chunk("你好"), chunk("，我是小智。"), DONE]
        return httpx.Response(200, headers=SSE, content=b"".join(parts))

    llm = make_llm(handler, temperature=0.3, max_tokens=64)
    assert isinstance(llm, ChatLLM)
    assert await collect(llm) == ["你好", "，我是小智。"]
    (request,) = seen
    assert request.method == "POST"
    assert str(request.url) == "http://llm.test/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer sk-test"
    body = json.loads(request.content)
    assert body == {
        "model": "test-model",
        "messages": MESSAGES,
        "stream": True,
        "temperature": 0.3,
        "max_tokens": 64,
    }


async def test_optional_fields_and_auth_are_left_out():
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, headers=SSE, content=chunk("ok") + DONE)

    llm = make_llm(handler, api_key=None, base_url="http://llm.test/v1/")
    assert await collect(llm) == ["ok"]
    assert "authorization" not in seen[0].headers
    assert str(seen[0].url) == "http://llm.test/v1/chat/completions"
    assert set(json.loads(seen[0].content)) == {"model", "messages", "stream"}


async def test_done_ends_stream_and_later_lines_are_ignored():
    llm = make_llm(sse_handler(chunk("one"), DONE, b"data: {not json\n\n", chunk("two")))
    assert await collect(llm) == ["one"]


async def test_stream_without_done_yields_what_arrived():
    llm = make_llm(sse_handler(chunk("a"), chunk("b")))
    assert await collect(llm) == ["a", "b"]


async def test_null_content_reasoning_and_usage_chunks_are_skipped():
    usage = json.dumps({"choices": [], "usage": {"total_tokens": 5}})
    llm = make_llm(
        sse_handler(
            chunk(role="assistant", content=None),
            chunk(reasoning_content="let me think"),
            chunk(None, reasoning_content="more thinking"),
            chunk(""),
            chunk("answer"),
            f"data: {usage}\n\n".encode(),
            DONE,
        )
    )
    assert await collect(llm) == ["answer"]


async def test_comments_crlf_multiline_events_and_split_network_chunks():
    event = json.dumps({"choices": [{"delta": {"content": "多行"}}]}, ensure_ascii=False)
    head, tail = event[:10], event[10:]
    raw = (
        b": keep-alive\r\n\r\n"
        + b"event: message\r\nid: 7\r\nretry: 100\r\n"
        + f"data: {head}\r\ndata: {tail}\r\n\r\n".encode()
        + b"\n\n\n"
        + f"data:{json.dumps({'choices': [{'delta': {'content': ' ok'}}]})}\n\n".encode()
        + DONE
    )

    async def pieces() -> AsyncIterator[bytes]:
        for index in range(0, len(raw), 3):  # cut through lines and multi-byte characters
            yield raw[index : index + 3]

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers=SSE, content=pieces())

    assert await collect(make_llm(handler)) == ["多行", " ok"]


async def test_non_streaming_json_answer_is_accepted():
    completion = {"choices": [{"message": {"role": "assistant", "content": "whole answer"}}]}
    llm = make_llm(sse_handler(json.dumps(completion).encode(), headers={"content-type": "application/json"}))
    assert await collect(llm) == ["whole answer"]


async def test_http_500_raises_with_status_and_body_snippet():
    llm = make_llm(sse_handler(b"upstream exploded\n" + b"x" * 5000, status=500))
    with pytest.raises(LLMError) as info:
        await collect(llm)
    message = str(info.value)
    assert "500" in message and "upstream exploded" in message
    assert len(message) < 600


async def test_http_401_json_error_is_reported():
    body = json.dumps({"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}})
    llm = make_llm(sse_handler(body.encode(), status=401, headers={"content-type": "application/json"}))
    with pytest.raises(LLMError, match=r"401.*Incorrect API key"):
        await collect(llm)


async def test_malformed_json_line_raises():
    llm = make_llm(sse_handler(chunk("fine"), b'data: {"choices": [\n\n', DONE))
    deltas = []
    with pytest.raises(LLMError, match="malformed JSON"):
        async for delta in llm.stream_chat(MESSAGES):
            deltas.append(delta)
    assert deltas == ["fine"]


async def test_unexpected_chunk_shape_raises():
    llm = make_llm(sse_handler(b'data: ["not", "an", "object"]\n\n'))
    with pytest.raises(LLMError, match="unexpected chunk"):
        await collect(llm)


async def test_error_object_mid_stream_raises():
    error = json.dumps({"error": {"message": "model overloaded"}})
    llm = make_llm(sse_handler(chunk("par"), f"data: {error}\n\n".encode()))
    with pytest.raises(LLMError, match="model overloaded"):
        await collect(llm)


async def test_error_event_raises():
    llm = make_llm(sse_handler(b'event: error\ndata: {"message": "rate limited"}\n\n'))
    with pytest.raises(LLMError, match="rate limited"):
        await collect(llm)


async def test_first_token_timeout_when_body_stalls():
    async def slow() -> AsyncIterator[bytes]:
        yield b": still thinking\n\n" + chunk(reasoning_content="hmm")
        await asyncio.sleep(10)
        yield chunk("too late")

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers=SSE, content=slow())

    llm = make_llm(handler, first_token_timeout_s=0.2)
    started = time.monotonic()
    with pytest.raises(LLMError, match="first-token timeout"):
        await collect(llm)
    assert time.monotonic() - started < 2


async def test_first_token_timeout_when_headers_stall():
    async def handler(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(10)
        return httpx.Response(200, headers=SSE, content=chunk("late") + DONE)

    llm = make_llm(handler, first_token_timeout_s=0.2)
    with pytest.raises(LLMError, match="first-token timeout"):
        await collect(llm)


async def test_transport_timeout_becomes_llm_error():
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectTimeout("connect timed out", request=request)

    with pytest.raises(LLMError, match="timed out.*ConnectTimeout"):
        await collect(make_llm(handler))


async def test_consumer_stopping_early_closes_the_response():
    async def endless() -> AsyncIterator[bytes]:
        while True:
            yield chunk("tick")
            await asyncio.sleep(0)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers=SSE, content=endless())

    responses: list[httpx.Response] = []

    async def remember(response: httpx.Response) -> None:
        responses.append(response)

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler), event_hooks={"response": [remember]})
    llm = OpenAIChatLLM(base_url="http://llm.test", api_key=None, model="m", client=client)
    stream = llm.stream_chat(MESSAGES)
    assert await anext(stream) == "tick"
    assert not responses[0].is_closed
    await stream.aclose()
    assert responses[0].is_closed


@pytest.mark.parametrize(
    "kwargs",
    [
        {"base_url": ""},
        {"base_url": "llm.test/v1"},
        {"model": ""},
        {"timeout_s": 0},
        {"first_token_timeout_s": -1},
        {"max_tokens": 0},
    ],
)
def test_bad_configuration_raises_value_error(kwargs):
    options = {"base_url": "http://llm.test/v1", "api_key": None, "model": "m"}
    with pytest.raises(ValueError):
        OpenAIChatLLM(**(options | kwargs))


@pytest.mark.parametrize("messages", [[], [{"content": "no role"}], [{"role": "user", "content": None}]])
async def test_bad_messages_raise_value_error(messages):
    llm = make_llm(sse_handler(DONE))
    with pytest.raises(ValueError):
        await collect(llm, messages)


async def test_aclose_leaves_an_injected_client_open_and_closes_its_own():
    client = httpx.AsyncClient(transport=httpx.MockTransport(sse_handler(DONE)))
    llm = OpenAIChatLLM(base_url="http://llm.test", api_key=None, model="m", client=client)
    await llm.aclose()
    assert not client.is_closed
    await client.aclose()

    own = OpenAIChatLLM(base_url="http://llm.test", api_key=None, model="m")
    async with own:
        pass
    with pytest.raises(RuntimeError, match="closed"):
        await collect(own)


# --- a real server on loopback -------------------------------------------------------------------


async def chat_completions(request: Request) -> StreamingResponse:
    body = await request.json()
    stall = body["messages"][-1]["content"] == "stall"

    async def events() -> AsyncIterator[bytes]:
        yield chunk("Hello")
        if stall:
            await asyncio.sleep(30)
        yield chunk(" from loopback.")
        yield DONE

    return StreamingResponse(events(), media_type="text/event-stream")


@pytest.fixture
async def loopback_url():
    app = Starlette(routes=[Route("/v1/chat/completions", chat_completions, methods=["POST"])])
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error", timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}/v1"
    server.should_exit = True
    await task


async def test_real_server_stream(loopback_url):
    async with OpenAIChatLLM(base_url=loopback_url, api_key="k", model="m") as llm:
        assert await collect(llm) == ["Hello", " from loopback."]


async def test_real_server_read_timeout(loopback_url):
    messages = [{"role": "user", "content": "stall"}]
    async with OpenAIChatLLM(base_url=loopback_url, api_key="k", model="m", timeout_s=1.5) as llm:
        deltas = []
        with pytest.raises(LLMError, match="timed out.*ReadTimeout"):
            async for delta in llm.stream_chat(messages):
                deltas.append(delta)
    assert deltas == ["Hello"]


async def test_connection_refused_raises():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with OpenAIChatLLM(base_url=f"http://127.0.0.1:{port}/v1", api_key=None, model="m") as llm:
        with pytest.raises(LLMError, match="ConnectError"):
            await collect(llm)
