"""The whole job's flags, named as Megatron names them (torchtitan's where it has no
name): sizes, batch, rank order, how the replicas shard and keep their state, the
optimizer on the host, the overlaps (ppsim.job)."""

from __future__ import annotations

import argparse
from typing import Any

from ppsim.config import limits, validate
from ppsim.config.state_rules import HOST_OPTIMIZER_KEYS
from ppsim.costs.choices import FSDP_RESHARD
from ppsim.costs.state import OPTIMIZER_DTYPES

JOB_MODEL_KEYS = ("dp", "cp", "ep", "etp", "distributed_optimizer", "grad_reduce_in_bf16",
                  "grads_in_fp32",
                  "precision_aware_optimizer", "fsdp", "fsdp_reshard_after_forward",
                  "fsdp_cpu_offload", "fsdp_framework", "dp_replicas", *OPTIMIZER_DTYPES,
                  *HOST_OPTIMIZER_KEYS)
"""[model] fields only the job flags set."""


def add_job_flags(p: argparse.ArgumentParser) -> None:
    """The whole job's shape and its overlaps, named as Megatron names them."""
    j = p.add_argument_group("job (Megatron's names; ppsim.job)")
    j.add_argument("--dp", type=int, metavar="N", help="data-parallel size")
    j.add_argument("--gpus", type=int, metavar="N", help="world size: dp = N / (tp x pp x cp)")
    j.add_argument("--cp", "--context-parallel-size", dest="cp", type=int, metavar="N",
                   help="context-parallel size")
    j.add_argument("--ep", "--expert-model-parallel-size", dest="ep", type=int, metavar="N",
                   help="expert-parallel size")
    j.add_argument("--etp", "--expert-tensor-parallel-size", dest="etp", type=_size,
                   metavar="N", help="ranks each expert's matmuls split over (default tp; "
                   "1 with a larger ep is Megatron's MoE parallel folding)")
    j.add_argument("--global-batch-size", type=int, metavar="N",
                   help="sequences per iteration: microbatches = N / (micro batch x dp)")
    j.add_argument("--rank-order", metavar="ORDER", help="Megatron rank order, innermost "
                   "first (default tp-cp-ep-dp-pp)")
    _add_state_flags(j)
    for name, what in (("tp-comm-overlap", "tensor-parallel collectives behind the GEMMs"),
                       ("overlap-grad-reduce", "the gradient reduce behind the last backward"),
                       ("overlap-param-gather", "the parameter all-gather behind the next "
                        "forward (needs --overlap-grad-reduce and the distributed optimizer)"),
                       ("moe-shared-expert-overlap", "the shared experts beside the "
                        "dispatcher's all-to-alls")):
        j.add_argument(f"--{name}", action="store_true", default=None,
                       help=f"Megatron's overlap: {what}")
    j.add_argument("--overlap-param-gather-with-optimizer-step", action="store_true",
                   default=None, help="the first model chunk's parameters gathered behind "
                   "the other chunks' optimizer steps (interleaved schedules)")
    j.add_argument("--overlap-moe-expert-parallel-comm", action="store_true", default=None,
                   help="Megatron's combined 1F1B: each forward beside another "
                   "microbatch's backward, their all-to-alls hidden by each other's compute "
                   "(needs ep > 1, and vpp > 1 when pp > 1)")
    j.add_argument("--delay-wgrad-compute", action="store_true", default=None,
                   help="with it: the experts' weight gradients beside the dispatch's "
                   "backward")
    j.add_argument("--ddp-bucket-size", type=int, metavar="N", help="parameters per gradient "
                   "bucket (default max(40M, 1M x dp x cp))")
    j.add_argument("--ddp-num-buckets", type=int, metavar="N",
                   help="or the rank's parameters in N buckets")


def megatron_fsdp_state(model: dict[str, Any]) -> dict[str, Any]:
    """The [model] fields the flags give, --use-distributed-optimizer beside
    --use-megatron-fsdp dropped: Megatron-FSDP (v1) turns it on itself and shards the
    optimizer's state its own way (arguments.py), as its launch lines pass it."""
    if model.get("fsdp_framework") == "megatron-fsdp" and model.get("distributed_optimizer"):
        return model | {"distributed_optimizer": None}
    return model


class _Sets(argparse.Action):
    """A switch that sets several fields at once (`fields`: name -> value)."""

    def __init__(self, *args: Any, fields: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(*args, nargs=0, default=None, **kwargs)
        self.fields = fields

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        for name, value in self.fields.items():
            setattr(namespace, name, value)


def _add_state_flags(j: argparse._ArgumentGroup) -> None:
    """How the replicas shard and keep their state: Megatron's distributed and
    precision-aware optimizers, torchtitan's FSDP2, the optimizer on the host."""
    j.add_argument("--use-distributed-optimizer", dest="distributed_optimizer",
                   action="store_true", default=None,
                   help="shard optimizer states and gradients over dp (ZeRO-1)")
    j.add_argument("--fsdp", action="store_true", default=None, help="shard weights, "
                   "gradients and optimizer states over dp x cp, one unit a layer: FSDP2 as "
                   "torchtitan applies it (ZeRO-3)")
    j.add_argument("--dp-replicas", "--num-distributed-optimizer-instances",
                   dest="dp_replicas", type=int, metavar="N", help="copies of the sharded "
                   "state across dp x cp (Megatron's partial distributed optimizer; with "
                   "--fsdp torchtitan's HSDP replicate degree)")
    j.add_argument("--use-torch-fsdp2", action=_Sets, dest="fsdp",
                   fields={"fsdp": True, "fsdp_framework": "megatron"},
                   help="FSDP2 as Megatron applies it: the model in the training dtype, its "
                   "gradients reduced in it (pp and ep 1)")
    j.add_argument("--use-megatron-fsdp", action=_Sets, dest="fsdp",
                   fields={"fsdp": True, "fsdp_framework": "megatron-fsdp"},
                   help="Megatron-FSDP (optim_grads_params): each layer gathered and "
                   "reduce-scattered every microbatch, the embedding and output layer "
                   "gathered once a step; takes --use-distributed-optimizer")
    j.add_argument("--torch-fsdp2-no-reshard-after-forward", action=_Sets,
                   dest="fsdp_reshard_after_forward",
                   fields={"fsdp_reshard_after_forward": "never"},
                   help="with --use-torch-fsdp2: keep the gathered weights to the backward")
    j.add_argument("--fsdp-cpu-offload", "--training.enable_cpu_offload",
                   dest="fsdp_cpu_offload", action="store_true", default=None,
                   help="with --fsdp: the shards, gradients and Adam's state in host memory, "
                   "Adam stepped there (torchtitan's training.enable_cpu_offload)")
    j.add_argument("--fsdp-reshard-after-forward", dest="fsdp_reshard_after_forward",
                   choices=FSDP_RESHARD, help="torchtitan's policy (default: free the "
                   "gathered weights after the forward unless pp > 1)")
    j.add_argument("--grad-reduce-in-bf16", dest="grad_reduce_in_bf16", action="store_true",
                   default=None, help="keep and reduce bf16 gradients in bf16, not fp32")
    j.add_argument("--accumulate-allreduce-grads-in-fp32", dest="grads_in_fp32",
                   action="store_true", default=None, help="keep and reduce fp16 "
                   "gradients in fp32, not fp16 (bf16's are unless --grad-reduce-in-bf16)")
    j.add_argument("--use-precision-aware-optimizer", dest="precision_aware_optimizer",
                   action="store_true", default=None, help="Adam's state in the dtypes "
                   "below (TransformerEngine's FusedAdam)")
    for key, choices in OPTIMIZER_DTYPES.items():
        j.add_argument(f"--{key.replace('_', '-')}", choices=choices,
                       help="with --use-precision-aware-optimizer")
    _add_host_optimizer_flags(j)


def _add_host_optimizer_flags(j: argparse._ArgumentGroup) -> None:
    """Megatron's optimizer on the host (ppsim.job.host_optimizer)."""
    j.add_argument("--optimizer-cpu-offload", dest="optimizer_cpu_offload",
                   action="store_true", default=None, help="step Adam on the host for part "
                   "of each rank's shard (with --use-precision-aware-optimizer)")
    j.add_argument("--optimizer-offload-fraction", dest="optimizer_offload_fraction",
                   type=float, metavar="F", help="the shard's share on the host (default 1)")
    j.add_argument("--overlap-cpu-optimizer-d2h-h2d", dest="overlap_cpu_optimizer_d2h_h2d",
                   action="store_true", default=None, help="copy out, step and copy back "
                   "tensor by tensor, beside each other")
    j.add_argument("--optimizer-cpu-threads", dest="optimizer_cpu_threads", type=int,
                   metavar="N", help="host threads each rank steps with: its OMP_NUM_THREADS "
                   "(default 1, torchrun's)")


def check_global_batch(gbs: int) -> None:
    """--global-batch-size in range (0 is not "unset" on the command line, as in Megatron,
    which asserts a positive global batch)."""
    validate.count("--global-batch-size", gbs, hi=limits.MAX_GLOBAL_BATCH,
                   fix="give the sequences per iteration, e.g. --global-batch-size 1024")


def _size(text: str) -> int:
    """A parallel size given on the command line: a whole number >= 1 (a config's etp 0
    means "tp"; the flag's 0 would silently mean the same)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n
