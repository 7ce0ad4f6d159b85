"""What `ppsim run` checks before any process starts: the launch's shape, the world
against this host, the builder, an injected fault, the torch peer's schedule."""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys
from typing import Any

from ppsim.costs.choices import MEGATRON_FSDP_FLAGS
from ppsim.costs.model import stage_cost
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


def check_builder(args: argparse.Namespace, fields: dict[str, Any], memory: Any = None
                  ) -> Any:
    """Import and call the builder here, so a bad one exits 2 before any process; with
    --print-launch (which runs nothing) only the spec's form is checked, no code loads
    (None returned); with a memory policy (`memory`: the problem's), its modules are
    checked against the builder's layers. Returns the builder."""
    from ppsim.executor.builders import (  # torch loads only when a run starts
        builder_spec,
        code_note,
        load_builder,
        split_spec,
    )

    where = "--model" if args.model else "model.builder"
    spec = builder_spec(args.model, fields)
    split_spec(spec, where)
    if args.print_launch:
        return None
    if note := code_note(spec):
        sys.stderr.write(f"ppsim run: note: {note}\n")
    try:
        builder = load_builder(spec, fields, where)
    except UserError:
        raise
    except Exception as exc:
        raise UserError(where, f"building the model failed: {type(exc).__name__}: {exc}",
                        "fix the builder or the [model] fields it reads") from None
    if memory is not None:
        check_policy_pieces(builder, memory.policies)
    return builder


def check_policy_pieces(builder: Any, policies: Any) -> None:
    """A policy naming modules the builder's layers have no piece for would run as if
    they were not named while the simulation frees their tensors: refused. One layer is
    built on the meta device (no memory) to look."""
    import torch

    from ppsim.executor.builders.policy import unsupported  # torch: only when a run starts

    with torch.device("meta"):
        layer = builder.layer(0)
    missing = dict.fromkeys(m for p in policies for m in unsupported(layer, p))
    if missing:
        raise UserError("memory", f"the builder's {type(layer).__name__} layers have no "
                        f"piece for {', '.join(missing)} (the executor recomputes and "
                        "offloads the shipped builders' modules, and core_attn in any layer "
                        "that uses AttentionCore)", "drop those modules, or build the layers "
                        "from ppsim.executor.builders.llama's")


def check_tensor_parallel(builder: Any, fields: dict[str, Any], tp: int,
                          sequence_split: bool) -> None:
    """What tp > 1 splits: the shipped builders' decoders (the built-in GPT, the
    Llama-style one with its latent attention, MoE layers and hybrid mixers: each MLP's
    units, and under sequence parallelism the tokens; the key/value heads whole, or at tp
    above them gathered as Megatron does, but in the built-in GPT; the heads' rule is the
    config's, ppsim.config.validate; the
    vocabulary is padded as Megatron pads it), or a builder of
    your own through its `parallelize`, tried here on the meta device."""
    from ppsim.executor.builders.gpt import GPTBuilder  # torch loads only here
    from ppsim.executor.builders.llama import LlamaBuilder  # (torch, as above)

    if not isinstance(builder, (GPTBuilder, LlamaBuilder)):  # hybrid stacks' is a Llama's
        _check_own_split(builder, tp, sequence_split)
        return
    if fields.get("attention", "gqa") != "mla":
        _check_kv_gather(builder, fields, tp)
    for key, what in (("ffn_hidden_size", "the MLP's units split by columns"),
                      *((("seq_length", "sequence parallelism splits the tokens"),)
                        if sequence_split else ())):
        if fields[key] % tp:
            fix = "choose tp dividing " + key + (", or --no-sequence-parallel"
                                                 if key == "seq_length" else "")
            raise UserError(f"model.{key}", f"{fields[key]} does not divide by tp ({tp}): "
                            f"{what} over the tensor ranks", fix)


def _check_kv_gather(builder: Any, fields: dict[str, Any], tp: int) -> None:
    """tp above the key/value groups: the Llama-style decoder gathers QKV as Megatron
    does (ppsim.executor.builders.qkv_gather), its interleaved width split evenly over
    the ranks (the config's rule, ppsim.costs.kv_split.qkv_width_problem); the built-in
    GPT splits whole key/value heads only."""
    from ppsim.executor.builders.gpt import GPTBuilder  # (torch, as above)

    groups = fields.get("num_kv_heads", fields["num_heads"])
    if tp <= groups:
        return
    if isinstance(builder, GPTBuilder):
        raise UserError("model.tp", f"{tp} exceeds num_kv_heads = {groups}: the built-in "
                        "GPT splits whole key/value heads over the tensor ranks, without "
                        "Megatron's gather of QKV", f"run tp <= {groups}, or give norm = "
                        "\"rmsnorm\" for the Llama-style decoder, which gathers it")



def _check_own_split(builder: Any, tp: int, sequence_split: bool) -> None:
    from ppsim.executor.builders.user_tp import dry_run  # torch loads only here

    if not callable(getattr(builder, "parallelize", None)):
        raise UserError("model.tp", f"tp = {tp}: the builder has no parallelize(module, "
                        "piece, tp) to split its pieces", "define it (README, 'Your own "
                        "model'), drop --model to run the shipped decoder, or --tp 1")
    tokens = builder.activation_shape[1]
    if sequence_split and tokens % tp:
        raise UserError("model.tp", f"the builder's {tokens} tokens do not divide by tp "
                        f"({tp}): sequence parallelism splits them",
                        "choose tp dividing them, or --no-sequence-parallel")
    try:
        dry_run(builder, tp, sequence_split)
    except Exception as exc:
        raise UserError("model.tp", f"the builder's parallelize failed at tp = {tp}: "
                        f"{type(exc).__name__}: {exc}", "fix parallelize, or choose "
                        "another tp") from None
    from ppsim.executor.builders.tied import tie_refusal, ties  # (torch, as above)
    from ppsim.executor.builders.user_tp import dry_group, parallelized  # (torch, as above)

    # Its split must keep the same rows of the table and of the head's copy of it.
    split = functools.partial(parallelized, builder, g=dry_group(tp, sequence_split))
    if ties(builder) and (why := tie_refusal(builder, split)):
        _refuse_untieable(why)


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


def check_tied(args: argparse.Namespace, problem: Any, builder: Any) -> None:
    """A tied model runs as Megatron runs it (ppsim.executor.tied) where the builder ties
    its head to its embedding (the shipped ones do as the config says; one of your own
    where it declares `tie_embeddings`) on the ppsim engine; a builder that ties other
    than the config says, or the torch engine (its stages tie nothing), is refused.
    `builder`: None with --print-launch (no code loads; only the engine is checked)."""
    tied = bool(problem.costs.tied.params)
    if tied and (args.engine == "torch" or getattr(args, "alongside_torch", False)):
        raise UserError("model.tie_embeddings", "torch.distributed.pipelining's stages keep "
                        "the LM head apart from the embedding (no shared table, no reduce "
                        "of its gradient)", "run it with --engine ppsim, without "
                        "--alongside-torch, or set tie_embeddings = false")
    if builder is None:
        return
    from ppsim.executor.builders.tied import tie_refusal, ties  # torch loads only when a run starts

    if ties(builder) != tied:
        says = "ties" if tied else "does not tie"
        raise UserError("model.tie_embeddings", f"the config {says} the embeddings but the "
                        f"builder's tie_embeddings is {ties(builder)}", "make them agree "
                        "(a builder of your own ties with tie_embeddings = True, its "
                        "embedding's table as `tokens`, its head's projection as `out`)")
    if tied and (why := tie_refusal(builder)):  # else the ranks fail once they start
        _refuse_untieable(why)


def _refuse_untieable(why: str) -> None:
    raise UserError("model.tie_embeddings", f"the builder ties the embeddings but {why}",
                    "name the embedding's nn.Embedding `tokens` and the head's nn.Linear "
                    "`out`, of one shape (or set tie_embeddings = false)")


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
