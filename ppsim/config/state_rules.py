"""Cross-field checks of how the replicas keep and step their state: FSDP beside the
distributed optimizer, copies of the sharded state, the precision-aware optimizer's
dtypes, the optimizer on the host, Muon. Each names the field and the fix;
ppsim.config.validate calls `check` once the fields' types and ranges are checked."""

from __future__ import annotations

from typing import Any

from ppsim.costs.choices import MEGATRON_FSDP_FLAGS
from ppsim.costs.state import OPTIMIZER_DTYPES
from ppsim.errors import UserError


def check(raw: dict[str, Any]) -> None:
    """Every rule below, on a transformer's merged fields."""
    optimizer_states(raw)
    host_optimizer(raw)
    muon(raw)
    sharding(raw)


def sharding(raw: dict[str, Any]) -> None:
    """FSDP is the replicas' whole sharding: not beside the distributed optimizer, and
    its reshard policy only with it."""
    if raw.get("fsdp", False) and raw.get("distributed_optimizer", False):
        raise UserError("model.fsdp", "FSDP already shards the optimizer's state, and the "
                        "weights and gradients too", "drop --use-distributed-optimizer "
                        "(distributed_optimizer in [model]), or drop --fsdp")
    for key, what in (("fsdp_reshard_after_forward", "policy"),
                      ("fsdp_cpu_offload", "CPU offload"), ("fsdp_framework", "framework")):
        if raw.get(key, False) not in (False, "default", "torchtitan") and not raw.get("fsdp"):
            raise UserError(f"model.{key}", f"is FSDP's {what} and FSDP is off",
                            "add --fsdp (fsdp = true in [model]), or drop it")
    flag = MEGATRON_FSDP_FLAGS.get(raw.get("fsdp_framework", "torchtitan"))
    if raw.get("fsdp_cpu_offload") and flag:
        raise UserError("model.fsdp_cpu_offload", "is torchtitan's (training."
                        f"enable_cpu_offload); Megatron's {flag} offers none",
                        "drop it, or use --fsdp (torchtitan's FSDP2)")
    if flag == "--use-megatron-fsdp" and raw.get("fsdp_reshard_after_forward",
                                                "default") != "default":
        raise UserError("model.fsdp_reshard_after_forward", "is FSDP2's; Megatron-FSDP's "
                        "optim_grads_params strategy frees each layer's gathered weights "
                        "after its forward", "drop it, or use --fsdp (torchtitan's FSDP2)")
    if flag == "--use-megatron-fsdp" and raw.get("dp_replicas", 1) != 1:
        raise UserError("model.dp_replicas", "Megatron-FSDP's hybrid sharding (copies "
                        "all-reduced once a step) is not priced", "drop it (or "
                        "--num-distributed-optimizer-instances), or use --fsdp "
                        "(torchtitan's HSDP)")
    replicas(raw)


def replicas(raw: dict[str, Any]) -> None:
    """Copies of the sharded state need one (how they divide the data-parallel group is
    checked with the job's shape: ppsim.job.shape)."""
    n = raw.get("dp_replicas", 1)
    if not isinstance(n, int) or n == 1:
        return
    if not (raw.get("distributed_optimizer") or raw.get("fsdp")):
        raise UserError("model.dp_replicas", "copies of the sharded state need a sharded "
                        "state", "add --use-distributed-optimizer or --fsdp, or drop it")


def optimizer_states(raw: dict[str, Any]) -> None:
    """The state dtypes as Megatron asserts them (optimizer_config.py, optimizer/
    __init__.py): other than fp32 only under the precision-aware optimizer, which needs
    the distributed optimizer; ppsim prices it for bf16 training."""
    aware = raw.get("precision_aware_optimizer", False)
    if raw.get("grads_in_fp32") and raw.get("main_grads_dtype", "fp32") != "fp32":
        raise UserError("model.main_grads_dtype", "--main-grads-dtype can only be fp32 when "
                        "--accumulate-allreduce-grads-in-fp32 is set (Megatron's words)",
                        "drop one of them")
    for key in OPTIMIZER_DTYPES:
        if not aware and raw.get(key, "fp32") != "fp32":
            raise UserError(f"model.{key}", f"{key} can only be fp32 when not using "
                            "precision-aware optimizer", "add --use-precision-aware-optimizer "
                            "(precision_aware_optimizer = true in [model])")
    if aware and raw.get("fsdp") and raw.get("fsdp_framework") == "megatron-fsdp":
        raise UserError("model.precision_aware_optimizer", "under Megatron-FSDP it steps "
                        "decoupled gradients, which ppsim does not price", "drop it, or "
                        "--use-megatron-fsdp")
    if aware and not raw.get("distributed_optimizer", False):
        raise UserError("model.precision_aware_optimizer", "--use-precision-aware-optimizer "
                        "only supported with distributed optimizer", "add "
                        "--use-distributed-optimizer (distributed_optimizer = true in [model])")
    if aware and raw.get("dtype", "bf16") != "bf16":
        raise UserError("model.precision_aware_optimizer", "ppsim prices the precision-aware "
                        "optimizer for bf16 training only", "train in bf16 (--bf16), or "
                        "drop it")


HOST_OPTIMIZER = {"optimizer_offload_fraction": 1.0, "overlap_cpu_optimizer_d2h_h2d": False,
                  "optimizer_cpu_threads": 1}
"""The host optimizer's settings and their defaults: inert unless it is on."""
HOST_OPTIMIZER_KEYS = ("optimizer_cpu_offload", *HOST_OPTIMIZER)
"""[model] fields of the optimizer on the host."""


def host_optimizer(raw: dict[str, Any]) -> None:
    """Megatron's optimizer on the host as its arguments.py asserts it: with the
    precision-aware optimizer (whose code path it reuses), FP8 parameter gathering only
    under the delayed recipe; its settings only with it."""
    if not raw.get("optimizer_cpu_offload", False):
        for key, default in HOST_OPTIMIZER.items():
            if key in raw and raw[key] != default:
                raise UserError(f"model.{key}", "is the host optimizer's and "
                                "--optimizer-cpu-offload is off", "add --optimizer-cpu-offload "
                                "(optimizer_cpu_offload = true in [model]), or drop it")
        return
    if not raw.get("precision_aware_optimizer", False):
        raise UserError("model.optimizer_cpu_offload", "The optimizer cpu offload must be used "
                        "in conjunction with `--use-precision-aware-optimizer`, as the hybrid "
                        "device optimizer reuses the code path of this flag (Megatron's words)",
                        "add --use-precision-aware-optimizer (precision_aware_optimizer = "
                        "true in [model])")
    if raw.get("fp8_param_gather", False) and raw.get("fp8_recipe", "delayed") != "delayed":
        raise UserError("model.optimizer_cpu_offload", "When `--fp8-param-gather` is enabled, "
                        "the optimizer cpu offload must be used in conjunction with "
                        "`--fp8-recipe delayed` (Megatron's words)",
                        "use --fp8-recipe delayed, or drop --fp8-param-gather")


def muon(raw: dict[str, Any]) -> None:
    """Muon as ppsim prices it: Megatron's, its state in fp32 (not torchtitan's FSDP2 nor
    the precision-aware optimizer's dtypes)."""
    if raw.get("optimizer", "adam") != "muon":
        return
    if raw.get("fsdp") and raw.get("fsdp_framework") == "megatron-fsdp":
        raise UserError("model.optimizer", "Megatron-FSDP does not support the muon "
                        "optimizer yet (Megatron's words)", "use --optimizer adam, or "
                        "drop --use-megatron-fsdp")
    for key, what in (("fsdp", "torchtitan's FSDP2"),
                      ("precision_aware_optimizer", "the precision-aware optimizer")):
        if raw.get(key):
            raise UserError("model.optimizer", f"muon with {what} is not priced (ppsim "
                            "prices Megatron's Muon, its state in fp32)",
                            f"drop {key} or use --optimizer adam")
