"""Megatron's flags that say in other words what ppsim's say: the recompute granularity
and method (as a recompute mode), and the virtual pipeline size given as layers per
virtual stage. Each refuses what Megatron's arguments.py refuses, with its reason."""

from __future__ import annotations

import sys
from typing import Any

from ppsim.errors import UserError
from ppsim.job.shape import dispatcher_refusal
from ppsim.policy.megatron import offload_refusal


def recompute_mode(granularity: str | None, method: str | None, memory: dict[str, Any],
                   recompute: str | None, grouped_gemm: bool = False,
                   named: str = "--recompute-granularity") -> str | None:
    """The global recompute mode Megatron's --recompute-granularity and --recompute-method
    say, refused where Megatron refuses them: "none" under a module list or the block
    method's first N (Megatron recomputes nothing else, whatever a preset's mode), and
    uniform's --recompute-num-layers 1 leaves `memory` (every layer, not the first N).
    `grouped_gemm`: --moe-grouped-gemm, which selective moe_act recompute needs; `named`:
    the flag that gave the granularity (--recompute-activations and --moe-layer-recompute
    set selective)."""
    if granularity is None:
        if method is not None:
            _drop_method(memory)
        return None
    if recompute is not None:
        raise UserError(named, "says what --recompute says",
                        "give one of them")
    if granularity == "selective":
        return _selective(method, memory, grouped_gemm)
    return _full(method, memory)


def _drop_method(memory: dict[str, Any]) -> None:
    """A method with no granularity: the line is Megatron's, and Megatron's
    TransformerConfig reads the method and the layer count only under a granularity, so
    the job recomputes nothing; priced as it runs, with a warning."""
    layers = " and --recompute-num-layers" if memory.pop("recompute_layers", None) else ""
    print(f"warning: Megatron ignores --recompute-method{layers} without "
          "--recompute-granularity (the job recomputes nothing); ppsim prices no "
          "recompute, as Megatron runs it (add --recompute-granularity full to recompute)",
          file=sys.stderr)


def _selective(method: str | None, memory: dict[str, Any], grouped_gemm: bool) -> str:
    """Selective granularity as Megatron's arguments.py and TransformerConfig check it."""
    if method is not None:
        raise UserError("--recompute-method", "recompute method is not yet supported for "
                        "selective recomputing granularity (Megatron's words)",
                        "drop it, or use --recompute-granularity full")
    if "recompute_layers" in memory:
        raise UserError("--recompute-num-layers", "When using recompute_granularity: "
                        "selective recompute_num_layers must be None. (Megatron's words)",
                        "drop it, or use --recompute-granularity full")
    modules = str(memory.get("recompute_modules", "")).replace(",", " ").split()
    if "moe_act" in modules and not grouped_gemm:
        raise UserError("--recompute-modules", "moe_act in recompute_modules is only "
                        "supported with moe_grouped_gemm. (Megatron's words)",
                        "add --moe-grouped-gemm")
    return "none" if "recompute_modules" in memory else "selective"


def _full(method: str | None, memory: dict[str, Any]) -> str:
    """Full granularity as TransformerConfig checks it; a module list beside it, which
    Megatron reads only under selective granularity, is dropped with a warning."""
    if method is None:
        raise UserError("--recompute-method", "Using recompute_granularity: full so "
                        "recompute_method must be \"block\" or \"uniform\" (Megatron's words)",
                        "add --recompute-method uniform (every layer) or block")
    if "recompute_layers" not in memory:
        raise UserError("--recompute-num-layers", "When using recompute_granularity: full "
                        "recompute_num_layers must be between 1 and "
                        "num_layers_per_pipeline_rank (Megatron's words)",
                        "add --recompute-num-layers 1 (uniform: every layer) or N (block)")
    if method == "uniform" and memory["recompute_layers"] != 1:
        raise UserError("--recompute-num-layers", "the uniform method with groups of more "
                        "than one layer keeps one input a group, which ppsim does not "
                        "model", "use --recompute-num-layers 1, or the block method")
    whole = "every layer" if method == "uniform" else \
        f"each stage's first {memory['recompute_layers']} layers"
    if "recompute_modules" in memory:
        # attention.py, transformer_layer.py, experts.py: each module recomputes only
        # under recompute_granularity == 'selective'; TransformerConfig says nothing.
        del memory["recompute_modules"]
        print(f"warning: Megatron ignores --recompute-modules under --recompute-granularity "
              f"full (it reads them only with selective); ppsim prices {whole} recomputed "
              "whole and no module, as Megatron runs it", file=sys.stderr)
    if method == "uniform":
        del memory["recompute_layers"]
        return "full"
    return "none"


OFFLOAD_KNOBS = {"offload_modules": "--offload-modules",
                 "offload_fraction": "--activation-offload-fraction (--offload-fraction)",
                 "offload_step_bytes": "--delta-offload-bytes-across-pp-ranks"}
"""[memory] key -> Megatron's flag, read only under --fine-grained-activation-offloading."""


def check_offload(switch: bool, memory: dict[str, Any], configured: bool) -> None:
    """Megatron's fine-grained offload flags as it reads them: attention.py and experts.py
    offload a module only when fine_grained_activation_offloading is set, so the other
    knobs alone offload nothing; the switch asserts a module list (TransformerConfig).
    `configured`: the config's [memory] names offload modules."""
    given = [flag for key, flag in OFFLOAD_KNOBS.items() if key in memory]
    if given and not switch:
        raise UserError(given[0], "Megatron offloads nothing without "
                        "--fine-grained-activation-offloading (it ignores the offload flags "
                        "then)", "add --fine-grained-activation-offloading")
    if switch and "offload_modules" not in memory and not configured:
        raise UserError("--fine-grained-activation-offloading", "needs the modules to "
                        "offload: Megatron asserts offload_modules is not empty",
                        "add --offload-modules M ..., or drop the switch")
    names = lambda key: tuple(str(memory.get(key, "")).replace(",", " ").split())  # noqa: E731
    refusal = offload_refusal(names("recompute_modules"), names("offload_modules"))
    if switch and refusal:
        # ppsim's executor runs such a set; the line, as a Megatron launch, stops there.
        print(f"warning: Megatron refuses these --offload-modules: {refusal} ppsim prices "
              "them as its executor runs them", file=sys.stderr)


def moe_layer_recompute(granularity: str | None, memory: dict[str, Any]) -> str:
    """Megatron's --moe-layer-recompute (transformer_config.py): selective granularity with
    the moe module added to the recompute modules (core_attn by default); refused with
    full granularity, as Megatron refuses it."""
    if granularity == "full":
        raise UserError("--moe-layer-recompute", "Do not set --moe-layer-recompute with full "
                        "recompute granularity", "drop one of them")
    modules = memory.get("recompute_modules", "core_attn").replace(",", " ").split()
    memory["recompute_modules"] = " ".join(modules + ["moe"] * ("moe" not in modules))
    return "selective"


def vpp_for_layers_per_stage(per_chunk: int, num_layers: int, pp: int, *,
                             embedding: bool, loss: bool, other: str | None) -> int:
    """The vpp Megatron derives from --num-layers-per-virtual-pipeline-stage: the layers of
    a pipeline stage (the embedding and the loss counted as layers where the split
    accounts for them) over the layers of a virtual stage. `other`: another vpp or
    uneven-split option given with it, which Megatron refuses."""
    flag = "--num-layers-per-virtual-pipeline-stage"
    if other is not None:
        raise UserError(flag, f"is given with {other}: Megatron takes one way to set the "
                        "virtual pipeline, and uneven stages only with "
                        "--num-virtual-stages-per-pipeline-rank", "keep one of the two")
    if per_chunk < 1:
        raise UserError(flag, f"must be at least 1, got {per_chunk}", "give N >= 1")
    layers = num_layers + embedding + loss
    if layers % pp:
        raise UserError(flag, f"number of layers of the model ({layers}) must be divisible "
                        f"by pipeline model parallel size ({pp})", "give another pp")
    if (layers // pp) % per_chunk:
        raise UserError(flag, f"number of layers per pipeline stage ({layers // pp}) must be "
                        f"divisible by number of layers per virtual pipeline stage "
                        f"({per_chunk})", "give a divisor of the stage's layers")
    return layers // pp // per_chunk


def check_flex_backend(backend: str | None, dispatcher: str,
                       enable_deepep: bool = False) -> None:
    """The flex dispatcher's backend: DeepEP (Megatron's default) is priced, and HybridEP
    as DeepEP (each token once to every node that holds one of its experts, then NVLink;
    a note says so); --moe-enable-deepep is DeepEP's older name (TransformerConfig's
    checks)."""
    if enable_deepep and dispatcher != "flex":
        raise UserError("--moe-enable-deepep", "DeepEP backend is only supported with flex "
                        "token dispatcher.", "add --moe-token-dispatcher-type flex")
    if enable_deepep and backend == "hybridep":
        raise UserError("--moe-enable-deepep", "Only one backend is supported for flex token "
                        "dispatcher.", "drop --moe-flex-dispatcher-backend hybridep")
    if backend is None or backend == "deepep":
        return
    if backend == "hybridep":
        print("note: HybridEP priced as DeepEP's dispatch (each token once to every node that "
              "holds one of its experts, then NVLink); its own kernels' rate is not measured",
              file=sys.stderr)
        return
    raise UserError("--moe-flex-dispatcher-backend", f"{backend}: ppsim prices DeepEP's "
                    "dispatch (each token once to a node, then NVLink)",
                    "give deepep (Megatron's default) or hybridep, or drop the flag")


def check_experts_parallel(arch: Any, dispatcher: str | None,
                           shared_overlap: bool = False) -> None:
    """Refuse the expert layouts ppsim does not price: the all-gather token dispatcher
    across expert-parallel ranks (ppsim prices the all-to-all one). `arch`: the model's
    Architecture, or None for a uniform model."""
    if dispatcher == "allgather" and shared_overlap:
        raise UserError("--moe-shared-expert-overlap", "moe_shared_expert_overlap only works "
                        "with alltoall or flex token dispatcher", "give "
                        "--moe-token-dispatcher-type alltoall")
    refusal = dispatcher_refusal(dispatcher, arch)
    if refusal is not None:
        raise UserError("--moe-token-dispatcher-type", *refusal)


def check_positions(seq: int | None, positions: int | None) -> None:
    """--max-position-embeddings (a learned position table's rows) against the sequence,
    as Megatron asserts it whatever the position embedding."""
    if positions is not None and seq is not None and positions < seq:
        raise UserError("--max-position-embeddings", f"max_position_embeddings ({positions}) "
                        f"must be greater than or equal to seq_length ({seq}) (Megatron's "
                        "words)", f"give --max-position-embeddings {seq} or more")
