"""The echo canceller's figures (canceller.py): ERLE over the frames with our reply playing, and how
much reply has played (the canceller's early guard, guard.py, reads it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gateway.aec.reference import RATE

ACTIVE_RMS = 50.0  # a reference frame this loud counts towards ERLE
CONVERGE_S = 1.0  # reference playing this long before ERLE counts


@dataclass
class EchoStats:
    erle_db: float | None
    delay_ms: float | None
    frames: int
    aligned_by_timestamps: bool


class EchoFigures:
    """Microphone and output energy over the frames with our reply playing, after convergence."""

    def __init__(self) -> None:
        self.active_s = 0.0  # s of reply played (reference frames over ACTIVE_RMS)
        self._mic_energy = 0.0
        self._out_energy = 0.0

    def account(self, mic: np.ndarray, ref: np.ndarray, out: np.ndarray) -> None:
        if np.sqrt(np.mean(ref.astype(np.float64) ** 2)) < ACTIVE_RMS:
            return
        self.active_s += ref.size / RATE
        if self.active_s <= CONVERGE_S:
            return
        self._mic_energy += float(np.sum(mic.astype(np.float64) ** 2))
        self._out_energy += float(np.sum(out.astype(np.float64) ** 2))

    @property
    def erle_db(self) -> float | None:
        """Echo return loss enhancement over the frames with our reply playing, after convergence."""
        if self._mic_energy <= 0:
            return None
        return 10 * np.log10(self._mic_energy / max(self._out_energy, 1.0))
