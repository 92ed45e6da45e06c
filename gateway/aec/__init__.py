"""Server-side acoustic echo cancellation of a session's uplink (issue 14).

`EchoReference` keeps what we sent (decoded downlink, 16 kHz) on the device's
play timeline; `EchoCanceller` removes its echo from the uplink with WebRTC's
AEC3 and keeps ERLE/delay figures; `DelayEstimator` measures the echo delay.
"""

from gateway.aec.canceller import EchoCanceller, EchoStats
from gateway.aec.delay import DelayEstimator
from gateway.aec.reference import EchoReference

__all__ = ["DelayEstimator", "EchoCanceller", "EchoReference", "EchoStats"]
