"""A Xiaozhi device simulator: OTA, hello, text or Opus speech, abort; records all.

Used by the integration tests and the gateway benchmark, and runnable by hand:

    python scripts/device_sim.py --url http://127.0.0.1:8000 --text "你好，今天天气怎么样？"
    python scripts/device_sim.py --transport mqtt --text "你好"     # MQTT + UDP (transport.mqtt on)

It speaks the protocol through the same sans-I/O codec (device role) over a
real WebSocket, records every downlink message and frame with its arrival
time, decodes the audio, and prints per-turn figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts.device_sim_turn import LostFrames, Record, Turn  # noqa: E402
from scripts.device_sim_ws import FIRMWARE_TOOLS, DeviceSimulator, McpToolError  # noqa: E402

__all__ = ["FIRMWARE_TOOLS", "DeviceSimulator", "LostFrames", "McpToolError", "Record", "Turn"]


async def _main(args: argparse.Namespace) -> int:
    sim: DeviceSimulator
    if args.transport == "mqtt":  # MQTT + UDP, as the firmware (or py-xiaozhi with --subscribe) does it
        from scripts.device_sim_mqtt import Impairment, MqttDeviceSimulator, SubscribingMqttDevice

        kind = SubscribingMqttDevice if args.subscribe else MqttDeviceSimulator
        sim = kind(args.url, uplink=Impairment(args.udp_loss, args.udp_reorder, seed=1),
                   downlink=Impairment(args.udp_loss, args.udp_reorder, seed=2))  # fmt: skip
    else:
        sim = DeviceSimulator(args.url, protocol_version=args.protocol_version)
    ota = await sim.ota()
    print("OTA:", json.dumps(ota, ensure_ascii=False))
    hello = await sim.connect()
    print("hello:", hello)
    await sim.listen_start("auto")
    for text in args.text or ["你好，今天天气怎么样？"]:
        turn = await sim.ask(text)
        print(json.dumps(turn.summary(), ensure_ascii=False))
        if args.save_wav:
            from audio_codecs.wav import wav_bytes

            Path(args.save_wav).write_bytes(wav_bytes(turn.audio, turn.sample_rate))
    await sim.close()
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--text", action="append", help="typed query (repeatable)")
    parser.add_argument("--protocol-version", type=int, default=1, choices=(1, 2, 3))
    parser.add_argument("--save-wav", help="write the last turn's decoded audio here")
    parser.add_argument("--transport", choices=("websocket", "mqtt"), default="websocket",
                        help="mqtt: MQTT + UDP as the firmware does it (OTA must offer `mqtt`: transport.mqtt)")
    parser.add_argument("--subscribe", action="store_true",
                        help="with --transport mqtt: subscribe to subscribe_topic, as py-xiaozhi does")
    parser.add_argument("--udp-loss", type=float, default=0.0, help="share of UDP packets lost, both ways")
    parser.add_argument("--udp-reorder", type=float, default=0.0, help="share of UDP packets reordered")
    sys.exit(asyncio.run(_main(parser.parse_args())))
