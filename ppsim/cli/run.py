"""`ppsim run`: check the config, launch torchrun, show progress, print the summary.

Imports nothing heavy at module level: `ppsim --help` and planning commands
must work without torch. torch is imported inside the handler only.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ppsim import fileio
from ppsim.cli import builder_checks, run_frameworks, runchecks
from ppsim.cli.context_checks import check_run_context
from ppsim.cli.flags import config_from_args, emit_json
from ppsim.cli.hardware_choice import assume_hardware
from ppsim.cli.loglines import for_log
from ppsim.cli.run_flags import add_run_arguments
from ppsim.cli.run_summary import print_summary
from ppsim.cli.schedule import print_notes
from ppsim.config.model import TransformerModel
from ppsim.config.schema import SPLIT_KEYS, config_to_dict
from ppsim.errors import UserError
from ppsim.executor import launch, rundir
from ppsim.executor.launch import failure_lines
from ppsim.executor.rundir import BYTES_PER_OP, spec_path
from ppsim.executor.runspec import RunSpec
from ppsim.pipeline.layout import is_layout
from ppsim.pipeline.problem import build_problem

HELP = "run a split for real with torch.distributed (torchrun) and record a trace"


def register(commands: dict[str, Any]) -> None:
    commands["run"] = (HELP, add_run_arguments, cmd_run)


def load_problem(args: argparse.Namespace) -> Any:
    """The Problem to run: the config's (--actions-csv, a config flag, replaces its order)."""

    return build_problem(run_config(args))


def run_config(args: argparse.Namespace) -> Any:
    """The config the ranks run: on the hardware a `simulate` of the same flags would
    choose (hardware_choice), so the run's trace and the simulation price one job."""
    run_frameworks.prepare_run(args)  # torchtitan's fields and DeepSpeed's config
    return run_frameworks.whole_loss(assume_hardware(args, config_from_args(args))[0])


def versus_args(args: argparse.Namespace) -> argparse.Namespace:
    """The run's flags with --versus as its split (counts or a layout string)."""
    key = "layout" if is_layout(args.versus) else "split"
    return argparse.Namespace(**{**vars(args), **dict.fromkeys(SPLIT_KEYS),
                                 key: args.versus})


def validate(args: argparse.Namespace) -> Any:
    """Everything checkable before a process starts; a UserError means exit 2."""
    fileio.refuse_unnamed({"--trace-dir": args.trace_dir, "--dump-grads": args.dump_grads})
    cfg = run_config(args)
    if not isinstance(cfg.model, TransformerModel):
        raise UserError("model.kind", "ppsim run trains a transformer, not a uniform cost "
                        "model", "use a preset (e.g. --preset tiny-gpt) or kind = \"transformer\"")
    fields = cfg.model.fields()
    run_frameworks.check_runs(args, cfg)
    runchecks.check_features(cfg)
    check_run_context(args, cfg)
    runchecks.check_engine(args, cfg)
    problem = load_problem(args)
    pp = problem.split.pp
    if not problem.split.standard_ends or problem.split.mtp:
        raise UserError("pipeline.layout", "the executor builds the embedding on the first "
                        "stage, the head on the last and no MTP layers",
                        "run a split without empty end stages or 'm' (plan and simulate "
                        "take any)")
    builder_checks.check_tied(problem, builder_checks.check_builder(args, fields,
                                                                    problem.memory))
    dp = _data_parallel(args, fields)
    if dp < 1:
        raise UserError("--dp", f"must be at least 1, got {dp}", "e.g. --dp 2")
    if dp > 1 and args.engine == "torch":
        raise UserError("--dp", "the torch peer runs one pipeline replica",
                        "use --engine ppsim with --dp, or --dp 1")
    tp, cp = cfg.model.arch.tp, cfg.model.arch.cp
    runchecks.check_experts(cfg, dp)
    if tp > 1:
        _check_tensor_parallel(args, fields, problem, tp, cfg.model.arch.sequence_parallel)
    runchecks.check_launch(args, pp * dp * tp * cp)
    runchecks.check_world(args, pp * dp * tp * cp)
    runchecks.check_host_memory(args, problem, dp * tp * cp)
    runchecks.check_run_numbers(args)
    if args.inject_fault:
        runchecks.check_fault(args.inject_fault, problem, args.iterations)
    if args.engine == "torch":
        runchecks.check_peer(problem)
    if args.versus:
        _check_versus(args, problem, dp)
    if args.alongside_torch:
        if args.engine != "ppsim" or dp != 1 or args.versus:
            raise UserError("--alongside-torch", "needs the ppsim engine, one pipeline "
                            "replica and no --versus", "drop the other flag")
        runchecks.check_peer(problem)
    return problem


def _check_tensor_parallel(args: argparse.Namespace, fields: dict[str, Any], problem: Any,
                           tp: int, sequence_split: bool) -> None:
    """tp > 1 runs the shipped decoders' column- and row-parallel layers on the ppsim
    engine."""
    from ppsim.executor.builders import builder_spec, load_builder  # torch loads only here

    builder_checks.check_tensor_parallel(load_builder(builder_spec(args.model, fields), fields),
                                    fields, tp, sequence_split)
    if args.engine != "ppsim" or args.alongside_torch or problem.schedule.split_backward:
        raise UserError("model.tp", f"tp = {tp} runs on the ppsim engine, without the torch "
                        "peer and without a split backward (W)", "use --engine ppsim, a "
                        "schedule such as 1f1b or interleaved-1f1b, or --tp 1")


def _data_parallel(args: argparse.Namespace, fields: dict[str, Any]) -> int:
    """--dp, else the model's dp field, else 1."""
    return int(args.dp if args.dp is not None else fields.get("dp", 1))


def run_spec(args: argparse.Namespace) -> Any:
    """Everything a rank needs, resolved once from the flags (a validated run's)."""
    from ppsim.executor.builders import (  # torch loads only when a run starts
        builder_spec,
        import_root,
    )

    cfg = run_config(args)
    fields = cfg.model.fields()
    versus = config_to_dict(run_config(versus_args(args))) if args.versus else None
    builder = builder_spec(args.model, fields)
    return RunSpec(config=config_to_dict(cfg), versus=versus, builder=builder,
                   builder_root=import_root(builder), dp=_data_parallel(args, fields),
                   device=args.device, engine=args.engine,
                   alongside_torch=bool(args.alongside_torch), iterations=args.iterations,
                   warmup=runchecks.warmup_iterations(args), seed=args.seed, lr=args.lr,
                   timeout_s=args.timeout_s,
                   trace_dir=args.trace_dir, inject_fault=args.inject_fault,
                   fault_mode=args.fault_mode, dump_grads=args.dump_grads)


def rank_imports(args: argparse.Namespace) -> list[str]:
    """Modules the ranks will import, imported once before torchrun forks them: torch's
    checkpoint and its pipelining import torch._dynamo, 1.6 s of CPU in each rank."""
    cfg = config_from_args(args)
    fields, memory = cfg.model.fields(), cfg.memory or {}
    checkpoints = (fields.get("recompute", "none") != "none" or fields.get("hybrid_layer_pattern")
                   or memory.get("recompute_modules") or memory.get("recompute_num_layers"))
    pipelining = args.engine == "torch" or args.alongside_torch
    return ["torch._dynamo"] if checkpoints or pipelining else []


def _check_versus(args: argparse.Namespace, problem: Any, dp: int) -> None:
    if args.engine != "ppsim" or dp != 1:
        raise UserError("--versus", "alternating two splits needs the ppsim engine and one "
                        "pipeline replica", "use --engine ppsim and --dp 1, or drop --versus")
    try:
        other = load_problem(versus_args(args))
    except UserError as exc:
        raise UserError("--versus", f"{args.versus}: {exc.problem}", exc.fix) from None
    if other.split.pp != problem.split.pp or not other.split.standard_ends or \
            other.split.mtp:
        raise UserError("--versus", f"{args.versus} is not a split of the same {problem.split.pp}"
                        " ranks with the embedding first and the head last",
                        "give N,N,... with one count per stage, like --split, or a layout "
                        "'Et*N|...|t*NL'")


def _own_files(args: argparse.Namespace) -> list[str]:
    """What this node's ranks write in the trace dir (removed again if the run fails)."""

    d = args.trace_dir
    lo = args.node_rank * args.nproc_per_node
    files = [spec_path(d)]
    files += [os.path.join(d, "parts", f"rank{r}.json") for r in range(lo, lo +
                                                                       args.nproc_per_node)]
    # the --versus split's and the torch engine's alongside, each in a folder of its own
    subs = ["versus"] * bool(args.versus) + ["torch"] * bool(args.alongside_torch)
    for sub in subs:
        files += [os.path.join(d, sub, "parts", f"rank{r}.json")
                  for r in range(lo, lo + args.nproc_per_node)]
    if args.node_rank == 0:
        files += [os.path.join(d, "trace.json"), os.path.join(d, "summary.json")]
        files += [os.path.join(d, sub, "trace.json") for sub in subs]
    return files


def _trace_bytes(problem: Any, iterations: int) -> int:
    ops = sum(len(a) for a in problem.schedule.actions)
    return ops * iterations * BYTES_PER_OP + 1_000_000


@contextmanager
def _signals_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP (a closed terminal, `kill`, a batch system's time limit) end
    the run as Ctrl-C does: ranks stopped, this run's files removed, the lock released.
    SIGKILL leaves no handler a chance (the next run clears the stale lock)."""
    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    caught = (signal.SIGTERM, signal.SIGHUP)
    old = {s: signal.signal(s, interrupt) for s in caught}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def cmd_run(args: argparse.Namespace) -> int:
    with _signals_interrupt():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    problem = validate(args)

    print_notes(problem.schedule, "run")
    if args.print_launch:
        args.trace_dir = rundir.planned(args.trace_dir)
        launch.print_launch(args, rundir.spec_path(args.trace_dir), run_spec(args).to_json())
        return 0
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UserError("--device", "cuda requested but torch sees no GPU here",
                            "use --device cpu")
    store = None
    if args.nnodes == 1:
        store = launch.JobStore(args.master_addr, args.master_port)
    elif args.node_rank == 0:
        launch.check_port_free(args.master_addr, args.master_port or 29500)
    try:
        run = rundir.prepare(args.trace_dir, args.node_rank, _trace_bytes(problem,
                                                                          args.iterations))
        args.trace_dir = run.path
        try:
            run_spec(args).write(rundir.spec_path(run.path))
            out = _launch(args, problem, store)
        except BaseException:
            rundir.release(run, _own_files(args))
            raise
    finally:
        if store is not None:
            store.close()
    if warnings := out.died_after_finishing():
        for line in warnings:
            sys.stderr.write(f"ppsim run: warning: {line}\n")
        out.returncode = 0
    rundir.release(run, _own_files(args) if out.returncode != 0 else [])
    if out.returncode != 0:
        _report_failure(out)
        return out.returncode if out.returncode > 0 else 1
    rundir.link_latest(run)
    return _finish(args)


def _launch(args: argparse.Namespace, problem: Any, store: Any) -> Any:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn

    err = Console(stderr=True)
    if args.nnodes > 1:
        # torchrun prints nothing while it waits for the other nodes' rendezvous.
        others = ", ".join(str(i) for i in range(args.nnodes) if i != args.node_rank)
        sys.stderr.write(f"ppsim run: node {args.node_rank} of {args.nnodes}: waiting at "
                         f"{args.master_addr}:{args.master_port or 29500} for node(s) "
                         f"{others} (the same command with --node-rank N there)\n")
    env = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
           launch.STORE_ENV: "{}:{}".format(*store.endpoint)} if store else {}
    lines = for_log("ppsim run")
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[note]}"),
                  console=err, transient=True, disable=lines is not None) as bar:
        task = bar.add_task(f"{args.engine} {problem.schedule.name} pp={problem.split.pp}",
                            total=args.iterations, note="starting ranks")

        def progress(msg: dict) -> None:
            note = f"iteration {msg['iteration']}/{msg['of']}  loss {msg['loss']:.4f}"
            bar.update(task, completed=msg["iteration"], note=note)
            if lines is not None:
                lines("training", f"iteration {msg['iteration']}/{msg['of']}, "
                      f"loss {msg['loss']:.4f}")

        argv = launch.torchrun_argv(args, rundir.spec_path(args.trace_dir),
                                    store.endpoint if store else None)
        return launch.run_torchrun(argv, progress, env_extra=env,
                                   close_fds=[store.listen_fd] if store else [],
                                   preload=rank_imports(args)
                                   if launch.rank_start(args) == "fork" else [])


def _report_failure(out: Any) -> None:
    import sys

    errors, notes = failure_lines(out)
    for line in errors:
        sys.stderr.write(f"ppsim run: error: {line}\n")
    for line in notes:
        sys.stderr.write(f"ppsim run: {line}\n")


def _finish(args: argparse.Namespace) -> int:
    import json
    import sys

    if args.node_rank != 0:
        sys.stderr.write(f"node {args.node_rank} done; node 0 writes the trace and summary\n")
        return 0
    with open(os.path.join(args.trace_dir, "summary.json"), encoding="utf-8") as fh:
        res = json.load(fh)
    if args.json:
        emit_json(res)
    else:
        print_summary(res)
    return 0
