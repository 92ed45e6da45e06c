"""The UDP side of the MQTT device simulators (scripts/device_sim_mqtt.py): a silent microphone frame,
`Impairment` (datagrams dropped and reordered in one direction, at the device's socket, so the server sees
exactly what a lossy network would give it) and the datagram socket's protocol."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MIC_FRAMES_ON_LISTEN", "SILENT_FRAME", "Impairment", "UdpProtocol"]


def _silent_frame() -> bytes:
    import numpy as np

    from audio_codecs.opus import OpusEncoder

    return OpusEncoder(16000, 60).encode(np.zeros(960, np.int16))[0]


SILENT_FRAME = _silent_frame()  # 60 ms of silence, 16 kHz mono Opus
MIC_FRAMES_ON_LISTEN = 3  # so that even a lossy link (--udp-loss) tells the server where the device is


@dataclass
class Impairment:
    """Random loss and reordering of datagrams, one direction: `loss` of them vanish, `reorder` of them
    arrive after the packet that follows them (the rest in order)."""

    loss: float = 0.0
    reorder: float = 0.0
    seed: int = 0
    dropped: int = 0
    reordered: int = 0
    _rng: random.Random = field(init=False, repr=False)
    _held: bytes | None = field(default=None, init=False, repr=False)
    _flush: asyncio.TimerHandle | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def apply(self, data: bytes, deliver: Any) -> None:
        if self.loss and self._rng.random() < self.loss:
            self.dropped += 1
            return
        if self._held is not None:
            held, self._held = self._held, None
            if self._flush is not None:
                self._flush.cancel()
            deliver(data)
            deliver(held)  # it was overtaken by this one
            return
        if self.reorder and self._rng.random() < self.reorder:
            self.reordered += 1
            self._held = data
            # a held packet with none behind it arrives a little late anyway
            self._flush = asyncio.get_running_loop().call_later(0.12, self._release, deliver)
            return
        deliver(data)

    def _release(self, deliver: Any) -> None:
        held, self._held = self._held, None
        if held is not None:
            deliver(held)


class UdpProtocol(asyncio.DatagramProtocol):
    def __init__(self, on_datagram: Any) -> None:
        self.on_datagram = on_datagram

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.on_datagram(data)

    def error_received(self, exc: Exception) -> None:
        pass  # ICMP port unreachable after the server went away
