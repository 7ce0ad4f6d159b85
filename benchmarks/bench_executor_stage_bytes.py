"""Per virtual stage, the bytes the executor keeps for one microbatch against the cost
model's, for the pooled policy launches' configurations (tiny GPT on CPU, and its MLA
variant): from the F to the B, and from the B to the W (what a split backward's deferred
weight gradients keep). The executor's count is its runtime's own
(ppsim.executor.stage_bytes); the differences are the causes of the measured-versus-
simulated peak gaps of tests/e2e/test_policy_launches.py.

Run:    .venv/bin/python benchmarks/bench_executor_stage_bytes.py
"""

from __future__ import annotations

import os
import tempfile

from ppsim.cli.flags import config_from_args
from ppsim.cli.main import build_parser
from ppsim.executor.stage_bytes import stage_bytes

POLICY = ("--recompute-modules core_attn --fine-grained-activation-offloading "
          "--offload-modules attn_norm,qkv_linear,mlp_norm")
CASES = {
    "1f1b": "--schedule 1f1b --pp 2 --split 5,3 --microbatches 4",
    "interleaved": "--schedule interleaved-1f1b --pp 2 --vpp 2 --split 3,1,2,2 "
                   "--microbatches 4",
    "zbv": "--schedule zbv --pp 2 --vpp 2 --split 2,3,2,1 --microbatches 4",
    "mla-1f1b": "--config {mla} --schedule 1f1b --pp 2 --split 5,3 --microbatches 4",
}
POLICIES = {"mla-1f1b": "--recompute-modules mla_up_proj,layernorm "
                        "--fine-grained-activation-offloading --offload-modules "
                        "core_attn,qkv_linear"}
MLA_TOML = ('[model]\npreset = "tiny-gpt"\ngated_mlp = true\nnorm = "rmsnorm"\n'
            'position = "rotary"\nattention = "mla"\nq_lora_rank = 32\nkv_lora_rank = 24\n'
            'qk_rope_head_dim = 8\nhead_dim = 16\nv_head_dim = 12\n')
"""tests/e2e/launch_cases.py's MLA launch: tiny-gpt with DeepSeek's latent attention."""


def main() -> None:
    folder = tempfile.mkdtemp()
    mla = os.path.join(folder, "mla.toml")
    with open(mla, "w") as fh:
        fh.write(MLA_TOML)
    for name, flags in CASES.items():
        flags = flags.format(mla=mla)
        for label, argv in (("plain", flags),
                            ("policy", f"{flags} {POLICIES.get(name, POLICY)}")):
            print(f"{name} {label}:")
            cfg = config_from_args(build_parser().parse_args(["simulate", *argv.split()]))
            for row in stage_bytes(cfg):
                line = (f"  stage {row.stage} rank {row.rank}: F..B executor {row.kept:>9,} "
                        f"model {row.model_kept:>9,} ({row.kept - row.model_kept:+,})")
                if name == "zbv":
                    line += (f"; B..W executor {row.weight_grad:>9,} model "
                             f"{row.model_weight_grad:>9,} "
                             f"({row.weight_grad - row.model_weight_grad:+,})")
                print(line)


if __name__ == "__main__":
    main()
