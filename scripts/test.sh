#!/usr/bin/env bash
# The test command: installs what is missing (scripts/setup.sh), lints, type-checks the seams, runs pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
bash scripts/setup.sh
"$PY" -m ruff check .
"$PY" -m mypy  # gateway/ and tts_engine/ ([tool.mypy] in pyproject.toml)
"$PY" -m pytest -q "$@"
