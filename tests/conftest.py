"""Suite-wide settings that must be in place before torch loads.

MKL picks its matrix kernels by CPU (AVX-512, AVX2, ...), and their rounding differs by a few float32
steps. The vocoder turns such differences in the flow's mel into waveform differences of ~1e-3 (the
f0 predictor's output is integrated into phase over seconds), so the token2wav parity cases, whose
tolerance is 5e-4, passed or failed by CPU model (red on AVX-512 Xeons here, green elsewhere).
MKL's conditional numerical reproducibility mode gives the same results on every x86-64 CPU, so the
suite checks one numerical path everywhere. A value set by the caller is kept.
"""

from __future__ import annotations

import os

os.environ.setdefault("MKL_CBWR", "COMPATIBLE")

# the store's engines: a real PostgreSQL server started on demand, SQLite files (tests/store_fixtures.py)
from tests.store_fixtures import (  # noqa: E402, F401
    own_postgres,
    postgres,
    postgres_template,
    postgres_url,
    store,
    store_url,
)
