#!/usr/bin/env bash
# Installs everything the gateway needs on a fresh Debian machine, into the
# active Python (activate a virtualenv first if you want one):
#   apt: libopus0 (Opus codec), espeak-ng (the built-in voice)
#   pip: torch==2.13.0 when no torch is installed, then this project + test and
#        asr extras, and FunASR for speech recognition (see below)
# With --serve it then starts the server (extra arguments go to `serve`).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

missing=()
for pkg in libopus0 espeak-ng; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]} with apt-get"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  echo "setup: installing torch==2.13.0"
  "$PY" -m pip install -q torch==2.13.0
fi

if ! "$PY" -c "import gateway, opuslib_next, fastapi, pytest_asyncio, kaldi_native_fbank" >/dev/null 2>&1 \
   || [ pyproject.toml -nt .setup-stamp ] 2>/dev/null; then
  echo "setup: installing the project and its test and asr extras"
  "$PY" -m pip install -q -e ".[test,asr]"
  touch .setup-stamp
fi

# FunASR (speech recognition) without its declared dependencies, which pull in
# transformers, umap-learn, numba, scikit-learn, ... for training and other
# models; what SenseVoice inference imports is the `asr` extra above. pip may
# then warn that funasr's other requirements are missing: that is expected.
if ! "$PY" -c "import importlib.util as u; assert u.find_spec('funasr') and u.find_spec('librosa')" \
     >/dev/null 2>&1; then
  echo "setup: installing FunASR for speech recognition (SenseVoice inference only)"
  "$PY" -m pip install -q --no-deps funasr==1.4.16 librosa==0.11.0
fi

if [ "${1:-}" = "--serve" ]; then
  shift
  exec "$PY" -m gateway serve "$@"
fi
echo "setup: done. Start the server with: $PY -m gateway serve"
