"""The WebSocket device of scripts/device_sim.py: OTA, hello, text or Opus speech, abort; records all.

It speaks the protocol through the same sans-I/O codec (device role) over a real WebSocket, records every
downlink message and frame with its arrival time and decodes the audio. The MQTT + UDP device
(scripts/device_sim_mqtt.py) is a subclass; scripts/device_sim.py is the command line over both.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import websockets

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from audio_codecs.opus import OpusDecoder, OpusEncoder  # noqa: E402
from gateway.xiaozhi import (  # noqa: E402
    Abort,
    AudioIn,
    AudioOut,
    Hello,
    Listen,
    ListenMode,
    ListenState,
    McpMessage,
    Role,
    ServerHello,
    TtsStop,
    XiaozhiConnection,
)
from scripts.device_sim_turn import LostFrames, Record, Turn  # noqa: E402
from scripts.sim_mcp import FIRMWARE_TOOLS, McpToolError, SimMcpServer  # noqa: E402

__all__ = ["FIRMWARE_TOOLS", "DeviceSimulator", "LostFrames", "McpToolError", "Record", "Turn"]


class DeviceSimulator:
    def __init__(
        self,
        base_url: str,
        *,
        device_id: str | None = None,
        client_id: str | None = None,
        protocol_version: int = 1,
        token: str | None = None,
        mcp_tools: list[dict[str, Any]] | None = None,
        mcp_page_size: int = 2,
        ws_url: str | None = None,
        use_query_identity: bool = False,
        decode: bool = True,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.device_id = device_id or "02:00:00:" + ":".join(f"{b:02x}" for b in uuid.uuid4().bytes[:3])
        self.client_id = client_id or str(uuid.uuid4())
        self.protocol_version = protocol_version
        self.token = token
        self.mcp_tools = mcp_tools
        self.mcp_page_size = mcp_page_size
        self.ws_url = ws_url
        self.use_query_identity = use_query_identity
        self.decode = decode
        self.on_audio: Callable[[AudioOut], None] | None = None  # sees each downlink frame on arrival
        self.conn = XiaozhiConnection(Role.DEVICE, binary_version=protocol_version)
        self.records: list[Record] = []
        self.raw_frames: list[bytes] = []
        # the device's MCP server (tools, recorded requests and calls, the speaker volume)
        self.mcp = SimMcpServer(mcp_tools, self._send_mcp, page_size=mcp_page_size)
        self.mcp_requests = self.mcp.requests
        self.server_hello: ServerHello | None = None
        self.closed = asyncio.Event()
        self._ws: Any = None
        self._inbox: asyncio.Queue[Record] = asyncio.Queue()
        self._reader: asyncio.Task[None] | None = None
        self._decoder: OpusDecoder | None = None

    # ---- connection ----------------------------------------------------------

    async def ota(self) -> dict[str, Any]:
        body = {
            "version": 2,
            "language": "zh-CN",
            "mac_address": self.device_id,
            "uuid": self.client_id,
            "minimum_free_heap_size": "8200000",
            "application": {"name": "xiaozhi", "version": "2.4.2"},
            "board": {"type": "bread-compact-wifi", "name": "sim"},
        }
        headers = {
            "Device-Id": self.device_id,
            "Client-Id": self.client_id,
            "Activation-Version": "1",
            "User-Agent": "bread-compact-wifi/2.4.2",
            "Accept-Language": "zh-CN",
        }
        # no certificate bundle to load for plain HTTP (it costs ~25 ms of CPU per client)
        async with httpx.AsyncClient(timeout=10, verify=self.base_url.startswith("https:")) as client:
            reply = await client.post(f"{self.base_url}/xiaozhi/ota/", json=body, headers=headers)
        reply.raise_for_status()
        data = reply.json()
        self.ws_url = self.ws_url or data["websocket"]["url"]
        return data

    async def connect(self, *, features: dict[str, Any] | None = None, timeout: float = 10.0) -> ServerHello:
        url = self.ws_url or self.base_url.replace("http", "ws", 1) + "/xiaozhi/v1/"
        headers = {"Protocol-Version": str(self.protocol_version)}
        if self.use_query_identity:
            sep = "&" if "?" in url else "?"
            url += f"{sep}device-id={self.device_id}&client-id={self.client_id}"
            if self.token:
                url += f"&authorization=Bearer%20{self.token}"
        else:
            headers.update({"Device-Id": self.device_id, "Client-Id": self.client_id})
            if self.token:
                headers["Authorization"] = f"Bearer {self.token}"
        self._ws = await websockets.connect(
            url, additional_headers=headers, compression=None, ping_interval=None, max_size=1 << 20
        )
        self._reader = asyncio.create_task(self._read())
        if features is None:
            features = {"mcp": self.mcp_tools is not None}
        await self.send(
            Hello(
                version=self.protocol_version,
                transport="websocket",
                features=features,
            )
        )
        record = await self.next_event(ServerHello, timeout=timeout)
        self.server_hello = record.event
        self.conn.session_id = self.server_hello.session_id
        self._decoder = OpusDecoder(self.server_hello.audio_params.sample_rate)
        return self.server_hello

    async def close(self) -> None:
        self.mcp.close()
        if self._ws is not None:
            await self._ws.close()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader

    async def __aenter__(self) -> DeviceSimulator:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- sending -----------------------------------------------------------

    async def send(self, event: Any) -> None:
        await self._ws.send(self.conn.send(event))

    async def send_raw(self, data: str | bytes) -> None:
        await self._ws.send(data)

    async def listen_start(self, mode: str = "auto") -> None:
        await self.send(Listen(state=ListenState.START, mode=ListenMode(mode)))

    async def listen_stop(self) -> None:
        await self.send(Listen(state=ListenState.STOP))

    async def detect(self, text: str) -> float:
        t = time.monotonic()
        await self.send(Listen(state=ListenState.DETECT, text=text))
        return t

    async def abort(self, reason: str | None = None) -> float:
        t = time.monotonic()
        await self.send(Abort(reason=reason))
        return t

    async def send_speech(self, pcm16k: np.ndarray, *, realtime: bool = False) -> int:
        """Opus-encodes 16 kHz PCM in 60 ms frames and sends them; returns the frame count."""
        encoder = OpusEncoder(16000, 60)
        packets = encoder.encode(pcm16k.astype(np.int16)) + encoder.flush()
        t0 = time.monotonic()
        for i, packet in enumerate(packets):
            if realtime:
                delay = t0 + i * 0.06 - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            await self.send(AudioIn(opus=packet))
        return len(packets)

    # ---- receiving ---------------------------------------------------------

    async def _read(self) -> None:
        try:
            async for message in self._ws:
                t = time.monotonic()
                if isinstance(message, bytes):
                    self.raw_frames.append(message)
                    event: Any = self.conn.receive_binary(message)
                    event = AudioOut(opus=event.opus, timestamp_ms=event.timestamp_ms)
                    if self.on_audio is not None:
                        self.on_audio(event)
                else:
                    event = self.conn.receive_text(message)
                    if isinstance(event, McpMessage):
                        await self.mcp.answer(event.payload)
                self._record(event, t)
        except websockets.ConnectionClosed:
            pass
        finally:
            self.closed.set()

    def _record(self, event: Any, t: float | None = None) -> None:
        """One received event, at its arrival time (now unless given)."""
        record = Record(time.monotonic() if t is None else t, event)
        self.records.append(record)
        self._inbox.put_nowait(record)

    async def _send_mcp(self, payload: dict[str, Any]) -> None:
        await self.send(McpMessage(payload=payload))

    async def next_event(self, kind: type | tuple[type, ...] = object, *, timeout: float = 10.0) -> Record:
        """The next received record whose event is of `kind` (others are skipped)."""
        try:
            async with asyncio.timeout(timeout):
                while True:
                    record = await self._inbox.get()
                    if isinstance(record.event, kind):
                        return record
        except TimeoutError:
            raise TimeoutError(f"no {kind} within {timeout} s") from None

    def drain(self) -> list[Record]:
        out = []
        while not self._inbox.empty():
            out.append(self._inbox.get_nowait())
        return out

    async def collect_turn(self, t_query: float, *, timeout: float = 30.0) -> Turn:
        """Records until `tts stop`, decoding the audio frames."""
        turn = Turn(t_query=t_query, sample_rate=self._decoder_rate())
        pcm: list[np.ndarray] = []
        try:
            async with asyncio.timeout(timeout):
                while True:
                    record = await self._inbox.get()
                    turn.records.append(record)
                    if isinstance(record.event, AudioOut) and self.decode and self._decoder is not None:
                        pcm.append(self._decoder.decode(record.event.opus))
                    elif isinstance(record.event, LostFrames) and self.decode and self._decoder is not None:
                        for _ in range(record.event.packets):  # packet-loss concealment, 60 ms each
                            pcm.append(self._decoder.conceal(self._decoder.sample_rate * 60 // 1000))
                    if isinstance(record.event, TtsStop):
                        break
        except TimeoutError:
            raise TimeoutError(f"turn did not end within {timeout} s") from None
        if pcm:
            turn.audio = np.concatenate(pcm)
        return turn

    def _decoder_rate(self) -> int:
        return self.server_hello.audio_params.sample_rate if self.server_hello else 16000

    async def ask(self, text: str, *, timeout: float = 30.0) -> Turn:
        """Types `text` (listen detect) and waits for the whole reply turn."""
        t = await self.detect(text)
        return await self.collect_turn(t, timeout=timeout)
