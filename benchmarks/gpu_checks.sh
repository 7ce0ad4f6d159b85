#!/usr/bin/env bash
# Every GPU check the issues name, for a lent GPU machine (one device, torch already there).
#
#   bash benchmarks/gpu_checks.sh [costs] [accuracy] [executor] [policy] [job] [fp8] [ep]
#                                 [share] [moe]
#                                                  (default: the first three)
#
# costs:    benchmarks/bench_costs.py --device cuda     measured vs analytic F/B/W (< 5 min)
# accuracy: benchmarks/bench_accuracy.py --device cuda  gpt3-1.3b layers, pp 2 and 4 sharing
#           the GPU, profile -> simulate -> run -> diff (< 6 min)
# executor: benchmarks/bench_executor.py --device cuda  ppsim vs torch engine (< 3 min)
# policy:   benchmarks/bench_memory_policy_gpu.py --device cuda  two memory policies (none;
#           core_attn + block N 2 + offload) on one GPU: measured activation peak per rank
#           and iteration time against the simulation (< 4 min)
# job:      benchmarks/bench_job.py --measure $OUT/job   issue 24's published runs: each
#           model's own matmuls and attention timed after a warm-up to the settled clock
#           (weak-<model>.toml; the target rows' first), then the runs predicted with them
#           beside the preset (< 5 min)
# fp8:      benchmarks/bench_fp8_gemm.py --device cuda  FP8 against bf16 GEMMs at the 70B and
#           405B linears' shapes, settled clock: the FP8 / bf16 ratio ppsim prices at 2.0
#           (< 2 min)
# ep:       benchmarks/bench_ep_overlap.py --measure $OUT/ep   Qwen3-235B's own kernels at tp 2
#           ep 32 (its experts' matmuls at the tokens a rank's experts get), settled clock,
#           then the ModelZoo rows (DeepEP, the combined 1F1B) priced with them (< 3 min;
#           needs simpy: carry .whl)
# share:    benchmarks/bench_sm_share.py --device cuda  the target rows' GEMMs with 16 SMs
#           carved out of cuBLAS against all 132: the compute a hidden collective slows,
#           priced at 132 / 116 - 1 = +13.8 % (< 2 min)
# moe:      benchmarks/bench_moe_layer.py --device cuda  a fine-grained MoE block's ops
#           (gpt-oss, Qwen3-30B-A3B, Nemotron 3 Nano at ep 8) timed one by one beside
#           ppsim's price of each: where the 40-57 % they read fast goes (< 2 min)
#
# One command may run 10 minutes there: run `costs` alone, then `accuracy executor`.
# Packages the machine lacks (simpy, textual) travel as wheels in .whl/ (git-ignored):
# `.venv/bin/pip download --no-deps -d .whl simpy` here, then carry .whl (job needs none);
# logs go to $OUT when it is set. GPU_CHECK_ARGS adds arguments to each check's script, e.g.
# GPU_CHECK_ARGS="--policies none,block,offload,policy --trace-out $OUT/traces" ... policy.
set -u
cd "$(dirname "$0")/.."
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
# The package as it installs (executor/ and tui/ as ppsim.executor and ppsim.tui), from
# links into this tree: nothing is built or installed.
tree=/tmp/ppsim-tree
rm -rf "$tree" && mkdir -p "$tree/ppsim"
ln -s "$PWD"/ppsim/* "$tree/ppsim/" && ln -s "$PWD/executor" "$tree/ppsim/executor" \
    && ln -s "$PWD/tui" "$tree/ppsim/tui"
# PYTHONSAFEPATH: `python -m ppsim.cli` run from the repository root must import the tree's
# ppsim (with executor/ and tui/), not the bare ./ppsim beside it.
export PYTHONPATH="$tree:$PWD/benchmarks:$PWD:${PYTHONPATH:-}" PYTHONSAFEPATH=1 \
    PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
out="${OUT:-/tmp/ppsim-gpu}"
mkdir -p "$out"
checks=("$@")
[ ${#checks[@]} -eq 0 ] && checks=(costs accuracy executor)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())'
declare -A script=([costs]=bench_costs.py [accuracy]=bench_accuracy.py [executor]=bench_executor.py
                   [policy]=bench_memory_policy_gpu.py [job]=bench_job.py
                   [fp8]=bench_fp8_gemm.py [ep]=bench_ep_overlap.py
                   [share]=bench_sm_share.py [moe]=bench_moe_layer.py)
declare -A args=([job]="--measure $out/job" [ep]="--measure $out/ep --quick")
declare -A limit=([costs]=290 [accuracy]=350 [executor]=200 [policy]=240 [job]=300
                  [fp8]=120 [ep]=180 [share]=120 [moe]=150)
for c in "${checks[@]}"; do
    echo "=== $c ($(date -u +%H:%M:%S))"
    # shellcheck disable=SC2086  # args holds several words
    timeout "${limit[$c]}" python3 "benchmarks/${script[$c]}" ${args[$c]:---device cuda} \
        ${GPU_CHECK_ARGS:-} 2>&1 \
        | tee "$out/$c.log"
    echo "=== $c exit ${PIPESTATUS[0]}"
done
