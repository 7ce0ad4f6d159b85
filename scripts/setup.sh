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
# pip's own chatter (and this machine's index warnings) go to a log, shown on failure.
log="$VENV/setup.log"
# --no-compile: modules are byte-compiled when first imported, not all of torch's now
# (setup takes half the time).
pip() {
  "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@" --no-compile >>"$log" 2>&1 \
    || { cat "$log" >&2; echo "setup: pip install $* failed (log: $log)" >&2; exit 1; }
}
echo "setting up $VENV (torch, simpy, textual, ...); log in $log" >&2
# One pip run for torch and the rest (one resolution: 12 s less than two); a torch the
# venv already has is kept.
torch=("${PPSIM_TORCH:-torch==2.13.0}")
if "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  torch=()
fi
pip install "${torch[@]}" -e ".[run,test]"
touch "$stamp"
