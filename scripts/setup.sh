#!/usr/bin/env bash
# Create .venv with ppsim and everything its tests need. Idempotent.
# torch is an optional extra (`ppsim[run]`): planning works without it.
# Here `torch==2.13.0` resolves to the CPU wheel on this machine's disk; on a
# GPU machine pip takes the CUDA build. Override with PPSIM_TORCH="torch==X".
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
stamp="$VENV/.ppsim-setup"
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ]; then
  exit 0
fi
python3 -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@"; }
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  pip install "${PPSIM_TORCH:-torch==2.13.0}"
fi
pip install -e ".[run,test]"
touch "$stamp"
