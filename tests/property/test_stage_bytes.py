"""Per virtual stage, the bytes the executor keeps for one microbatch equal the cost
model's within 2 %: from F to B (a stage's input counted once, held by the runtime
until the B; a sent output freed, as Megatron's deallocate_output_tensor) and from B
to W (each deferred matmul's input and output gradient, a shared input once)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from ppsim.cli.flags import config_from_args  # noqa: E402
from ppsim.cli.main import build_parser  # noqa: E402
from ppsim.executor.stage_bytes import stage_bytes  # noqa: E402

POLICY = ["--recompute-modules", "core_attn",
          "--fine-grained-activation-offloading", "--offload-modules",
          "attn_norm,qkv_linear,mlp_norm"]
SCHEDULES = {"1f1b": 1, "interleaved-1f1b": 2, "zbv": 2}


@st.composite
def runs(draw: st.DrawFn) -> list[str]:
    """A schedule on 2 ranks, a split of the tiny GPT's 8 layers (every stage at least
    one layer, so each has a layer's activations to compare), with or without a policy,
    with or without a sliding window on every other layer (its mask is a constant)."""
    schedule = draw(st.sampled_from(sorted(SCHEDULES)))
    stages = 2 * SCHEDULES[schedule]
    cuts = sorted(draw(st.sets(st.integers(1, 7), min_size=stages - 1, max_size=stages - 1)))
    counts = [b - a for a, b in zip([0, *cuts], [*cuts, 8], strict=True)]
    argv = ["--schedule", schedule, "--pp", "2", "--split", ",".join(map(str, counts)),
            "--microbatches", "4"]
    if stages > 2:
        argv += ["--vpp", "2"]
    window = ["--preset", "tiny-gpt", "--window-size", "5,0", "--window-attn-skip-freq", "2"]
    return (argv + (POLICY if draw(st.booleans()) else [])
            + (window if draw(st.booleans()) else []))


@settings(max_examples=12, deadline=None)
@given(runs())
def test_executor_keeps_the_models_bytes_per_stage(argv: list[str]) -> None:
    cfg = config_from_args(build_parser().parse_args(["simulate", *argv]))
    for row in stage_bytes(cfg):
        assert abs(row.kept - row.model_kept) <= 0.02 * row.model_kept, (argv, row)
        assert abs(row.weight_grad - row.model_weight_grad) <= 0.02 * row.model_weight_grad, (
            argv, row)
