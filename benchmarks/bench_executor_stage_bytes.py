"""Per virtual stage, the bytes the executor keeps for one microbatch's backward against
the cost model's, for the pooled policy launches' configurations (tiny GPT on CPU).

The executor's count is its runtime's own (`saved_bytes` over the stage's forward plus
the stage's output it holds, the input handed over on one rank counted once), the
model's is what an F allocates in the simulator (`resident_bytes`). The differences
are the causes of the measured-versus-simulated peak gaps of
tests/e2e/test_policy_launches.py.

Run:    .venv/bin/python benchmarks/bench_executor_stage_bytes.py
"""

from __future__ import annotations

import torch

from ppsim.cli.flags import config_from_args
from ppsim.cli.main import build_parser
from ppsim.executor.builders import DEFAULT_BUILDER, load_builder
from ppsim.executor.builders.policy import apply_policy
from ppsim.executor.builders.stage import build_stage, saved_bytes
from ppsim.pipeline.problem import build_problem
from ppsim.sim.copies import resident_bytes

POLICY = "--recompute-modules core_attn --offload-modules attn_norm,qkv_linear,mlp_norm"
CASES = {
    "1f1b": "--schedule 1f1b --pp 2 --split 5,3 --microbatches 4",
    "interleaved": "--schedule interleaved-1f1b --pp 2 --vpp 2 --split 3,1,2,2 "
                   "--microbatches 4",
    "zbv": "--schedule zbv --pp 2 --vpp 2 --split 2,3,2,1 --microbatches 4",
}


def stage_bytes(argv: list[str]) -> list[tuple[int, int, int]]:
    """Per virtual stage: (rank, executor bytes, model bytes) of one microbatch."""
    cfg = config_from_args(build_parser().parse_args(["simulate", *argv]))
    p = build_problem(cfg)
    b = load_builder(DEFAULT_BUILDER, cfg.model.fields())
    costs = p.stage_costs
    ids, _ = b.microbatch(0, 0, 0)
    x: torch.Tensor | None = None
    out = []
    for st in p.split.stages:
        mod = build_stage(b, st, 0, "none").to(b.dtype)
        if p.memory is not None:
            apply_policy(mod.layers, p.memory.policies[st.index])
        params = {t.untyped_storage().data_ptr() for t in [*mod.parameters(), *mod.buffers()]}
        assert st.has_embedding or x is not None
        inp = ids if st.has_embedding else x.detach().requires_grad_(True)  # type: ignore
        with saved_bytes(params) as seen:
            y = mod(inp)
        seen[y.untyped_storage().data_ptr()] = y.untyped_storage().nbytes()
        rank = p.schedule.stage_rank(st.index)
        if st.index > 0 and p.schedule.stage_rank(st.index - 1) == rank:
            seen.pop(inp.untyped_storage().data_ptr(), None)  # counted by the stage before
        out.append((rank, sum(seen.values()), resident_bytes(costs[st.index])))
        x = y
    return out


def main() -> None:
    for name, flags in CASES.items():
        for label, argv in (("plain", flags), ("policy", f"{flags} {POLICY}")):
            print(f"{name} {label}:")
            for i, (rank, got, want) in enumerate(stage_bytes(argv.split())):
                print(f"  stage {i} rank {rank}: executor {got:>9,} model {want:>9,} "
                      f"difference {got - want:+,}")


if __name__ == "__main__":
    main()
