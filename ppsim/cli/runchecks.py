"""What `ppsim run` checks before any process starts: the launch's shape, the world
against this host, an injected fault, the torch peer's schedule (the builder's checks:
ppsim.cli.builder_checks)."""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Any

from ppsim.config.validate import count
from ppsim.costs.choices import MEGATRON_FSDP_FLAGS
from ppsim.costs.model import stage_cost
from ppsim.costs.op_sac import OP_SAC
from ppsim.errors import UserError
from ppsim.pipeline.torch_rules import torch_refusal, torch_rounds
from ppsim.schedules.generators import Action


def check_engine(args: argparse.Namespace, cfg: Any) -> None:
    """torch.distributed.pipelining's engine steps with AdamW alone."""
    if cfg.model.arch.optimizer == "muon" and (getattr(args, "engine", "ppsim") == "torch"
                                               or getattr(args, "alongside_torch", False)):
        raise UserError("model.optimizer", "muon: the torch engine steps with AdamW",
                        "run it with --engine ppsim, without --alongside-torch")


def check_launch(args: argparse.Namespace, world: int) -> None:
    """The launch's nodes, port and ranks per node against the run's `world` (pp x dp x
    tp x cp ranks)."""
    if args.nnodes < 1 or not 0 <= args.node_rank < args.nnodes:
        raise UserError("--node-rank", f"{args.node_rank} is not in 0..{args.nnodes - 1}",
                        "give each node a distinct rank below --nnodes")
    if args.master_port is not None and not 1 <= args.master_port <= 65535:
        raise UserError("--master-port", f"{args.master_port} is not a TCP port",
                        "give a port in 1..65535, or leave it out for a free one")
    if args.nproc_per_node is None:
        args.nproc_per_node = max(1, world // args.nnodes)
    if args.nproc_per_node * args.nnodes != world:
        raise UserError("--nproc-per-node", f"{args.nproc_per_node} x {args.nnodes} node(s) = "
                        f"{args.nproc_per_node * args.nnodes} ranks but pp x dp x tp x cp = "
                        f"{world}", f"run pp x dp x tp x cp = {world} ranks in all (one rank "
                        "per pipeline stage, replica, tensor and context-parallel rank)")


def check_experts(cfg: Any, dp: int) -> None:
    """The routed experts' etp x ep ranks fold into each pipeline stage's tp x cp x dp
    ranks (Megatron's MoE parallel folding), as the run launches them."""
    a = cfg.model.arch
    ranks, folded = a.tp * a.cp * dp, a.expert_tp * a.ep
    if not a.num_experts or ranks % folded == 0:
        return
    step = folded // math.gcd(folded, a.tp * a.cp)
    raise UserError("model.etp" if a.etp else "model.ep",
                    f"etp x ep = {a.expert_tp} x {a.ep} expert ranks do not divide a pipeline "
                    f"stage's tp x cp x dp = {a.tp} x {a.cp} x {dp} ranks",
                    f"run --dp {step} (or a multiple), or set ep (and etp) to divide tp x cp x dp")


RANKS_PER_DEVICE = 8
"""Ranks one CPU core (or GPU) may carry before a run on one node is refused: tests run
4 ranks on 2 cores; 2,000 ranks on 2 cores would only thrash, or exhaust memory."""

MAX_SEED = 2**32 - 1
"""The largest --seed: seeds of 0 to 2**32 - 1 stay inside torch's 64-bit ones."""


def host_devices(device: str) -> int:
    if device == "cuda":
        import torch  # only for --device cuda

        return max(1, torch.cuda.device_count())
    return os.cpu_count() or 1


def check_world(args: argparse.Namespace, world: int) -> None:
    """A world far beyond this host's devices: a warning for a printed launch (it may run
    on other hosts), refused for a run here on one node."""
    devices = host_devices(args.device)
    if world <= RANKS_PER_DEVICE * devices:
        return
    what = f"pp x dp x tp x cp = {world:,} ranks, more than {RANKS_PER_DEVICE} per {args.device} " \
           f"device of this host ({devices:,})"
    if args.print_launch or args.nnodes > 1:
        sys.stderr.write(f"ppsim run: warning: {what}; run it on nodes that have them\n")
        return
    raise UserError("--dp", what, "use a smaller --dp or pp, or launch on several nodes "
                    "(--nnodes, --print-launch)")


def warmup_iterations(args: argparse.Namespace) -> int:
    """--warmup, or its default: the first iteration, unless it is the only one."""
    if args.warmup is not None:
        return int(args.warmup)
    return 1 if args.iterations > 1 else 0


def check_run_numbers(args: argparse.Namespace) -> None:
    """The run's counts and numbers in range: iterations, warm-up, timeout, learning rate."""
    if args.iterations < 1:
        raise UserError("--iterations", f"must be at least 1, got {args.iterations}",
                        "e.g. --iterations 5")
    if not 0 <= warmup_iterations(args) < args.iterations:
        raise UserError("--warmup", f"{args.warmup} warm-up of {args.iterations} iterations",
                        "need iterations >= 1 and 0 <= warmup < iterations")
    if not (math.isfinite(args.timeout_s) and 0 < args.timeout_s <= 7 * 86400):
        raise UserError("--timeout-s", f"must be a number of seconds in (0, 604800], got "
                        f"{args.timeout_s}", "e.g. --timeout-s 120")
    if not (math.isfinite(args.lr) and args.lr > 0):
        raise UserError("--lr", f"must be a positive finite number, got {args.lr}",
                        "e.g. --lr 1e-3")
    # The ranks mix it into torch's 64-bit seeds (executor/builders): a larger one would
    # fail in every rank after the launch.
    count("--seed", args.seed, lo=0, hi=MAX_SEED, fix="e.g. --seed 0")


def available_host_bytes() -> int | None:
    """Memory this host can still give (Linux's MemAvailable); None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_host_memory(args: argparse.Namespace, problem: Any, copies: int) -> None:
    """A run on this host's CPU whose ranks' weights, gradients and optimizer state alone
    (the model's, `copies` times: tensor ranks x replicas) pass the memory it has free,
    refused before any process starts (it would end in the OOM killer)."""
    if args.device != "cpu" or args.print_launch or args.nnodes > 1:
        return
    costs = problem.costs
    state = stage_cost(costs, 0, costs.num_layers, True, True).static_bytes * copies
    _refuse_beyond_host(state, "the run's weights, gradients and optimizer state alone take "
                        f"{state / 1e9:,.1f} GB over its ranks")


def check_profile_memory(costs: Any, param_bytes: int, processes: int) -> None:
    """`ppsim profile` builds the embedding, up to four decoder layers of each kind and the
    head, each weight with its gradient, and times one piece at a time (its forward's
    saved tensors held until its backward, and what that backward holds beside them while
    it runs, such as the head's logit gradient), in each of `processes` at once: refused
    before any starts where that passes the memory this host has free (the OOM killer's
    SIGKILL would end it with a traceback). `costs`: the model's analytic ModelCosts."""
    saved = max(c.activation_bytes + c.transient_bytes
                for c in (costs.embedding, *costs.layers, costs.head))
    need = (2 * param_bytes * profiled_params(costs) + saved) * processes
    _refuse_beyond_host(need, f"the profile's pieces (embedding, a few layers of each kind, "
                        f"head), their gradients and one piece's forward and backward tensors take "
                        f"{need / 1e9:,.1f} GB over {processes} process(es)")


def profiled_params(costs: Any) -> int:
    """The fewest parameters a profile builds: the embedding, the head and the four
    smallest decoder layers of each kind (it builds up to four of each)."""
    by_kind: dict[str, list[int]] = {}
    for kind, layer in zip(costs.kinds or ("layer",) * len(costs.layers), costs.layers,
                           strict=True):
        by_kind.setdefault(kind, []).append(layer.params)
    return costs.embedding.params + costs.head.params + sum(
        sum(sorted(v)[:4]) for v in by_kind.values())


def _refuse_beyond_host(need: float, what: str) -> None:
    free = available_host_bytes()
    if free is None or need <= free:
        return
    raise UserError("model", f"{what}, and this host has {free / 1e9:,.1f} GB free",
                    "run a smaller model (--preset tiny-gpt, fewer --num-layers, a smaller "
                    "--hidden-size), or on GPUs (--device cuda)")


def check_recompute_runs(a: Any) -> None:
    """The executor's recompute modes are Megatron's: torchtitan's SelectiveAC is refused."""
    if a.recompute == OP_SAC:
        raise UserError("model.recompute", f"{OP_SAC}: the executor's blocks are built as "
                        "Megatron's (query and key-value projections apart, biases), where "
                        "torchtitan's per-op policy would save other tensors",
                        "run it with recompute full or none, on a torchtitan line "
                        "activation-checkpoint:full or activation-checkpoint:none (simulate "
                        "and plan price op-sac)")


def check_features(cfg: Any) -> None:
    """What the config asks that the executor does not run: refused, not run otherwise."""
    a = cfg.model.arch
    if cfg.pipeline.overlap_moe_expert_parallel_comm:
        raise UserError("pipeline.overlap_moe_expert_parallel_comm", "the executor runs its "
                        "all-to-alls in order, overlapping none", "drop it to run the model "
                        "(simulate and plan price it)")
    if cfg.pipeline.moe_token_dispatcher_type == "flex" and a.num_experts:
        raise UserError("pipeline.moe_token_dispatcher_type", "flex: the executor has no "
                        "DeepEP (its processes talk over gloo)", "drop it to run the model "
                        "(simulate and plan price DeepEP)")
    check_recompute_runs(a)
    if a.fsdp_by_megatron:
        raise UserError("model.fsdp_framework", "the executor shards as torchtitan does "
                        "(fp32 shards, an fp32 reduce), not as Megatron's "
                        f"{MEGATRON_FSDP_FLAGS[a.fsdp_framework]}",
                        "run it with --fsdp (simulate and plan price Megatron's)")
    for key in ("optimizer_cpu_offload", "fsdp_cpu_offload"):
        if getattr(a, key):
            raise UserError(f"model.{key}", "the executor steps its optimizer where its "
                            "ranks run (on the CPU, there is nothing to offload to)",
                            "drop it to run the model (simulate and plan price it)")
    if a.optimizer == "muon" and (a.distributed_optimizer or a.fsdp):
        raise UserError("model.optimizer", "muon: the executor runs it with DDP (it builds "
                        "no layer-wise distributed optimizer)", "drop distributed_optimizer "
                        "(and fsdp) to run it; simulate and plan price it sharded")
    if a.fsdp:
        _check_fsdp(cfg)
    if a.distributed_optimizer and a.dp_replicas > 1:
        raise UserError("model.dp_replicas", "the executor's distributed optimizer shards "
                        "over the whole data-parallel group", "drop dp_replicas to run the "
                        "model; simulate and plan price the partial distributed optimizer")
    if not a.gradient_accumulation_fusion:
        raise UserError("model.gradient_accumulation_fusion", "the executor's gradients "
                        "land as torch's autograd lands them, with no Transformer Engine "
                        "fusion to turn off", "drop --no-gradient-accumulation-fusion to run "
                        "the model (simulate and plan price it)")


def _check_fsdp(cfg: Any) -> None:
    """The executor runs FSDP as torchtitan does with pipeline parallelism (gathered once
    a step, reduced after the last backward), over the whole data-parallel group."""
    a = cfg.model.arch
    if cfg.pipeline.pp == 1:
        raise UserError("model.fsdp", "the executor runs FSDP with pipeline parallelism only "
                        "(without it torchtitan gathers and reduces every microbatch)",
                        "use pp >= 2 to run it; simulate and plan price FSDP at pp = 1")
    if a.fsdp_reshard_after_forward == "always":
        raise UserError("model.fsdp_reshard_after_forward", "always: the executor keeps the "
                        "gathered weights for the step", "use default or never to run the "
                        "model; simulate and plan price resharding after each forward")
    if a.dp_replicas > 1:
        raise UserError("model.dp_replicas", "the executor's FSDP shards over the whole "
                        "data-parallel group", "drop dp_replicas to run the model; simulate "
                        "and plan price HSDP")


def check_fault(text: str, problem: Any, iterations: int) -> None:
    from ppsim.executor.runtime import Fault  # torch loads only when a run starts

    try:
        f = Fault.parse(text)
    except ValueError:
        raise UserError("--inject-fault", f"cannot read {text!r}",
                        "write RANK:KIND:STAGE:MB[:ITER], e.g. 1:B:1:0") from None

    if f.rank >= problem.split.pp or Action(f.kind, f.stage, f.microbatch) not in \
            problem.schedule.actions[f.rank]:
        raise UserError("--inject-fault", f"rank {f.rank} runs no {f.kind} of stage {f.stage} "
                        f"microbatch {f.microbatch}", "pick an op from that rank's schedule")
    if f.iteration >= iterations:
        raise UserError("--inject-fault", f"iteration {f.iteration} never runs (iterations "
                        f"0..{iterations - 1})", "pick an iteration below --iterations")


def check_peer(problem: Any) -> None:
    from ppsim.executor.peer import PEER_SCHEDULES, peer_class  # torch loads only when a run starts

    s = problem.schedule
    if s.name not in PEER_SCHEDULES:
        raise UserError("--engine", f"torch.distributed.pipelining peer has no {s.name!r}",
                        "use --engine ppsim, or one of " + ", ".join(PEER_SCHEDULES))
    refusal = torch_refusal(s.name, s.pp, s.vpp, s.microbatches)
    if s.name == "1f1b" and refusal:
        raise UserError("pipeline.microbatches", refusal, f"set microbatches >= {s.num_stages}")
    rounds = torch_rounds(s.pp, s.microbatches)
    if refusal:
        raise UserError("pipeline.microbatches", f"torch's {peer_class(s.name, s.vpp)} needs "
                        f"microbatches divisible by its rounds max(1, m // pp) = {rounds} "
                        "(ppsim's engine runs this m with Megatron's microbatch groups)",
                        f"use e.g. {s.microbatches - s.microbatches % rounds} microbatches, or "
                        "run ppsim's order in torch's runtime: ppsim schedule --csv o.csv, then "
                        "--actions-csv o.csv")
