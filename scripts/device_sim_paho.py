"""The MQTT client of `SubscribingMqttDevice` (scripts/device_sim_mqtt.py), as py-xiaozhi runs it: paho-mqtt
in its own network thread, a SUBSCRIBE to `subscribe_topic` after CONNACK, each PUBLISH that arrives
handed to the event loop in arrival order."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["PahoConnection"]


class PahoConnection:
    """``on_text`` gets each message's text on the loop (run by ``reader``, a task the device owns);
    ``on_closed`` is called on the loop when paho loses the connection."""

    def __init__(self, on_text: Callable[[str], Awaitable[None]], on_closed: Callable[[], object]) -> None:
        self.client: Any = None
        self.subscribed = asyncio.Event()
        self.granted: list[int] = []
        self._on_text = on_text
        self._on_closed = on_closed

    async def connect(self, mqtt: dict[str, Any], host: str, port: int, keepalive: int, *,
                      client_id: str | None, username: str | None, password: str | None,
                      tasks: list[asyncio.Task[Any]], timeout: float) -> int:  # fmt: skip
        """Connects (the device's ``mqtt`` object from OTA, each credential overridable); the CONNACK code,
        after the subscription's SUBACK when it is 0. The reader task joins ``tasks``."""
        import paho.mqtt.client as paho

        loop = asyncio.get_running_loop()
        connack: asyncio.Future[int] = loop.create_future()
        client = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=client_id or mqtt["client_id"],
                             clean_session=True, protocol=paho.MQTTv311)  # fmt: skip
        client.username_pw_set(username or mqtt["username"], password or mqtt["password"])

        def on_connect(c: Any, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
            code = reason.value if hasattr(reason, "value") else int(reason)
            loop.call_soon_threadsafe(lambda: connack.done() or connack.set_result(code))
            if code == 0:
                c.subscribe(mqtt["subscribe_topic"], qos=1)

        def on_subscribe(c: Any, userdata: Any, mid: Any, reasons: Any, properties: Any) -> None:
            codes = [r.value if hasattr(r, "value") else int(r) for r in reasons]
            loop.call_soon_threadsafe(lambda: (self.granted.extend(codes), self.subscribed.set()))

        messages: asyncio.Queue[str] = asyncio.Queue()  # in arrival order, handled on the loop

        def on_message(c: Any, userdata: Any, message: Any) -> None:
            loop.call_soon_threadsafe(messages.put_nowait, message.payload.decode("utf-8"))

        async def handle() -> None:
            while True:
                await self._on_text(await messages.get())

        tasks.append(asyncio.create_task(handle()))

        def on_disconnect(c: Any, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
            loop.call_soon_threadsafe(self._on_closed)

        client.on_connect, client.on_subscribe = on_connect, on_subscribe
        client.on_message, client.on_disconnect = on_message, on_disconnect
        await asyncio.to_thread(client.connect, host, port, keepalive)
        client.loop_start()
        self.client = client
        async with asyncio.timeout(timeout):
            code = await connack
            if code == 0:
                await self.subscribed.wait()
        return code

    async def publish(self, topic: str, text: str, qos: int) -> None:
        assert self.client is not None
        info = self.client.publish(topic, text.encode("utf-8"), qos=qos)
        if qos:
            await asyncio.to_thread(info.wait_for_publish, 5)

    @property
    def is_open(self) -> bool:
        return self.client is not None and self.client.is_connected()

    async def disconnect(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            done = threading.Event()
            client.on_disconnect = lambda *a: done.set()
            client.disconnect()
            await asyncio.to_thread(done.wait, 2)
            client.loop_stop()
