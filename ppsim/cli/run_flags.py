"""`ppsim run`'s flags: the config's, how torchrun launches, and what the run does."""

from __future__ import annotations

import argparse

from ppsim.cli.flag_values import nonempty
from ppsim.cli.flags import add_config_flags


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    add_config_flags(p, job_flags=False)  # its own --dp counts replicas it launches
    g = p.add_argument_group("launch")
    g.add_argument("--nproc-per-node", type=int, metavar="N",
                   help="ranks on this node (default: pp x dp x tp x cp / nnodes)")
    g.add_argument("--nnodes", type=int, default=1, metavar="K", help="nodes (default 1)")
    g.add_argument("--node-rank", type=int, default=0, metavar="I",
                   help="this node's index, 0 to K-1 (default 0)")
    g.add_argument("--master-addr", default="127.0.0.1", metavar="ADDR",
                   help="node 0's address, for the rendezvous (default 127.0.0.1)")
    g.add_argument("--master-port", type=int, metavar="PORT",
                   help="rendezvous port (default: a free one when nnodes = 1, else 29500)")
    g.add_argument("--print-launch", action="store_true",
                   help="print the torchrun command and a Slurm sbatch script; run nothing")
    r = p.add_argument_group("run")
    r.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where the ranks compute (default cpu: gloo)")
    r.add_argument("--rank-start", choices=("fork", "exec"),
                   help="how torchrun starts each rank: fork (torch imported once; the "
                   "default on CPU) or exec (an interpreter per rank, as --print-launch's "
                   "torchrun; the default with --device cuda)")
    r.add_argument("--engine", choices=("ppsim", "torch"), default="ppsim",
                   help="ppsim's runtime, or torch.distributed.pipelining's schedules")
    r.add_argument("--iterations", type=int, default=3, metavar="N",
                   help="training iterations to run and record (default 3)")
    r.add_argument("--warmup", type=int, metavar="N",
                   help="leading iterations marked warm-up and left out of the summary "
                   "(default 1, none for a run of one iteration)")
    r.add_argument("--trace-dir", metavar="DIR",
                   help="where trace.json and summary.json go; refused if it holds an earlier "
                   "run's results (default: a fresh ppsim-run/<time>, with ppsim-run/latest "
                   "pointing at the last successful run)")
    r.add_argument("--timeout-s", type=float, default=120.0, metavar="S",
                   help="give up on a stuck transfer after S seconds")
    r.add_argument("--inject-fault", metavar="RANK:KIND:STAGE:MB[:ITER]",
                   help="raise inside that op (tests failure handling)")
    r.add_argument("--model", metavar="MODULE:FUNCTION", type=nonempty("a builder"),
                   help="model builder (default: [model] builder, else the built-in GPT, "
                   "ppsim.executor.builders.gpt:build); a builder is code: naming one, "
                   "here or in a config, runs it (--print-launch loads none); see README "
                   "'Your own model'")
    _add_parallel_arguments(r)
    r.add_argument("--versus", metavar="SPLIT", type=nonempty("a split"),
                   help="also run this split (counts N,N,... or a layout string) in the "
                   "same processes, alternating iteration "
                   "by iteration with the run's own, so the machine's drift hits both "
                   "alike (A/B on a shared machine); its trace goes to DIR/versus/, its "
                   "summary under \"versus\" (ppsim engine, dp 1)")
    r.add_argument("--alongside-torch", action="store_true",
                   help="also run torch.distributed.pipelining's schedule on the same split "
                   "in the same processes, alternating iteration by iteration, both timed "
                   "from a barrier to the end of the step (the engine benchmark); its "
                   "trace goes to DIR/torch/, its summary under \"peer\" (ppsim engine, "
                   "dp 1, no --versus)")
    r.add_argument("--seed", type=int, default=0, help="weights and data seed")
    r.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate")
    r.add_argument("--json", action="store_true", help="one JSON object on stdout")
    r.add_argument("--dump-grads", metavar="PREFIX", help=argparse.SUPPRESS)
    # Tests only: the faulty rank SIGKILLs itself instead of reporting (a silent death).
    r.add_argument("--fault-mode", choices=("raise", "kill"), help=argparse.SUPPRESS)


def _add_parallel_arguments(r: argparse._ArgumentGroup) -> None:
    """The run's data- and context-parallel flags (tp, ep come with the config flags)."""
    r.add_argument("--dp", type=int, metavar="N",
                   help="data-parallel replicas of the pipeline: world = pp x dp "
                   "(default: the model's dp, else 1)")
    r.add_argument("--cp", "--context-parallel-size", dest="cp", type=int, metavar="N",
                   help="context-parallel ranks of each replica: world = pp x dp x tp x cp "
                   "(default: the model's cp; the traffic --cp-comm-type names, p2p unsaid)")
    r.add_argument("--use-distributed-optimizer", dest="distributed_optimizer",
                   action="store_true", default=None, help="with --dp: Megatron's "
                   "distributed optimizer (gradients reduce-scattered, each replica stepping "
                   "its shard, the weights all-gathered)")
    r.add_argument("--fsdp", action="store_true", default=None, help="with --dp and pp >= 2: "
                   "torchtitan's FSDP as it runs with pipeline parallelism (fp32 shards, the "
                   "weights gathered and the gradients reduced once a step)")
