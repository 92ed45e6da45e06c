#!/usr/bin/env bash
# Installs everything the gateway needs on a fresh Debian machine, into the
# active Python (activate a virtualenv first if you want one):
#   apt: libopus0 (Opus codec), libspeexdsp1 (server AEC's linear stage), espeak-ng (the
#        built-in voice), chromium and
#        fonts-noto-color-emoji (the web console's browser tests, driven by Playwright),
#        nginx (tests/test_deploy_topology.py runs deploy/nginx.conf unprivileged on loopback),
#        postgresql (the store's tests start their own server: initdb in a temporary folder)
#   pip: torch==2.13.0 when no torch is installed, then this project + test and
#        asr extras, FunASR for speech recognition and amqtt's MQTT packets (see below)
# With --models it then downloads the speech models (scripts/download_model.py:
# Fun-CosyVoice3-0.5B-2512, ~4.4 GB, and SenseVoiceSmall, ~0.9 GB, into models/;
# resumed when run again; $MODEL_ARGS adds options, e.g. MODEL_ARGS="--source hf").
# With --serve it then starts the server (the arguments after it go to `serve`).
#   bash scripts/setup.sh [--models] [--serve [--host H] [--port P] [--config FILE]]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

models=0
serve=0
serve_args=()
for arg in "$@"; do
  case "$arg" in
    --models) models=1 ;;
    --serve) serve=1 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *)
      if [ "$serve" -eq 1 ]; then
        serve_args+=("$arg")
      else
        echo "setup: unknown option $arg (use --models, --serve [serve options])" >&2
        exit 2
      fi
      ;;
  esac
done

missing=()
for pkg in libopus0 libspeexdsp1 espeak-ng chromium fonts-noto-color-emoji nginx postgresql; do
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

if ! "$PY" -c "import gateway, opuslib_next, fastapi, pytest_asyncio, kaldi_native_fbank, wetext, playwright, \
mypy, sqlalchemy, aiosqlite, asyncpg, greenlet, cryptography, paho.mqtt.client" >/dev/null 2>&1 \
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

# xiaozhi-sdk (tests/test_xiaozhi_sdk_client.py: a third-party device client) without its declared
# dependencies: its CLI's sounddevice (needs PortAudio), pydub, pillow, colorlog, ... are never
# imported by its client core, whose imports (aiohttp, py-machineid, opuslib, requests) are in the
# `test` extra. Its `opuslib` (module opuslib) and our opuslib-next (module opuslib_next) coexist.
if ! "$PY" -c "import importlib.util as u; assert u.find_spec('xiaozhi_sdk')" >/dev/null 2>&1; then
  echo "setup: installing xiaozhi-sdk (a device client for the tests) without its CLI's dependencies"
  "$PY" -m pip install -q --no-deps xiaozhi-sdk==0.5.1
fi

# amqtt's MQTT packet classes (the codec of transport.mqtt, gateway/transport/mqtt_codec.py) without its
# declared dependencies: it pins websockets==15.0.1 for its broker's WebSocket listener, which we do not
# use and which would replace this project's websockets; its packet modules import only websockets,
# pyyaml and typing_extensions, which the project already has.
if ! "$PY" -c "import importlib.util as u; assert u.find_spec('amqtt')" >/dev/null 2>&1; then
  echo "setup: installing amqtt (MQTT packet codec) without its broker's dependencies"
  "$PY" -m pip install -q --no-deps amqtt==0.12.1
fi

if [ "$models" -eq 1 ]; then
  echo "setup: downloading the speech models (run again to resume)"
  # shellcheck disable=SC2086  # MODEL_ARGS is a list of options
  if ! "$PY" scripts/download_model.py ${MODEL_ARGS:-}; then
    echo "setup: the model download did not finish; run the same command again to resume" >&2
    exit 1
  fi
fi

if [ "$serve" -eq 1 ]; then
  exec "$PY" -m gateway serve "${serve_args[@]}"
fi
echo "setup: done. Check the models with: $PY -m gateway check; start the server with: $PY -m gateway serve"
