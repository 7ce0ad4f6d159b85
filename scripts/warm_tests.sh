#!/usr/bin/env bash
# Collect the tests once after setup, in two halves at once, before `make test` starts its
# three workers. A first collection rewrites every test module's asserts and byte-compiles
# what the tests import, torch's modules among them (about 27 s of CPU on a fresh .venv);
# pytest and Python cache both in __pycache__, but three workers starting on a fresh clone
# would each do it all. Runs once per .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
stamp="$VENV/.ppsim-tests-warm"
[ -f "$stamp" ] && exit 0
mapfile -t files < <(ls tests/*/test_*.py)
halves=("" "")
for i in "${!files[@]}"; do
  halves[$((i % 2))]+=" ${files[$i]}"
done
collect() {
  # shellcheck disable=SC2086 # the half is a list of paths without spaces
  OMP_NUM_THREADS=1 "$VENV/bin/python" -m pytest -q --collect-only -p no:xdist \
    -p no:cacheprovider $1 >/dev/null 2>&1
}
collect "${halves[0]}" &
first=$!
collect "${halves[1]}" || true  # a collection error shows in the real run
wait "$first" || true
touch "$stamp"
