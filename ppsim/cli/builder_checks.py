"""What `ppsim run` and `ppsim profile` check of the model's builder before any process
starts: that it builds, runs the memory policy's modules, splits over the tensor ranks
(and, above the key/value groups, gathers QKV as Megatron does) and ties as the config
says. torch loads only inside each check."""

from __future__ import annotations

import argparse
import functools
import sys
from typing import Any

from ppsim.errors import UserError


def check_builder(args: argparse.Namespace, fields: dict[str, Any], memory: Any = None
                  ) -> Any:
    """Import and call the builder here, so a bad one exits 2 before any process; with
    --print-launch (which runs nothing) only the spec's form is checked, no code loads
    (None returned); with a memory policy (`memory`: the problem's), its modules are
    checked against the builder's layers. Returns the builder."""
    from ppsim.executor.builders import (  # torch loads only when a run starts
        builder_spec,
        code_note,
        split_spec,
    )

    where = "--model" if args.model else "model.builder"
    spec = builder_spec(args.model, fields)
    split_spec(spec, where)
    if args.print_launch:
        return None
    if note := code_note(spec):
        sys.stderr.write(f"ppsim run: note: {note}\n")
    builder = load_checked(spec, fields, where)
    if memory is not None:
        check_policy_pieces(builder, memory.policies)
    return builder


def load_checked(spec: str, fields: dict[str, Any], where: str) -> Any:
    """The builder `spec` names, built from `fields` and held to its contract; what its
    code raises is refused in `where`'s name (not a traceback)."""
    from ppsim.executor.builders import load_builder  # torch loads only when a run starts

    try:
        builder = load_builder(spec, fields, where)
    except UserError:
        raise
    except Exception as exc:
        raise UserError(where, f"building the model failed: {type(exc).__name__}: {exc}",
                        "fix the builder or the [model] fields it reads") from None
    check_own_contract(builder, where)
    return builder


def check_own_contract(builder: Any, where: str) -> None:
    """A builder of one's own keeps its contract (ppsim.executor.builders.contract); the
    shipped ones are tested for theirs."""
    from ppsim.executor.builders.contract import check_contract  # torch loads only here
    from ppsim.executor.builders.gpt import GPTBuilder  # (torch, as above)
    from ppsim.executor.builders.llama import LlamaBuilder  # (torch, as above)

    if not isinstance(builder, (GPTBuilder, LlamaBuilder)):
        check_contract(builder, where)


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
    above them QKV gathered as Megatron does, ppsim.executor.builders.qkv_gather; the
    heads' and the gathered width's rules are the config's, ppsim.config.validate; the
    vocabulary is padded as Megatron pads it), or a builder of your own through its
    `parallelize`, tried here on the meta device."""
    from ppsim.executor.builders.gpt import GPTBuilder  # torch loads only here
    from ppsim.executor.builders.llama import LlamaBuilder  # (torch, as above)

    if not isinstance(builder, (GPTBuilder, LlamaBuilder)):  # hybrid stacks' is a Llama's
        _check_own_split(builder, tp, sequence_split)
        return
    for key, what in (("ffn_hidden_size", "the MLP's units split by columns"),
                      *((("seq_length", "sequence parallelism splits the tokens"),)
                        if sequence_split else ())):
        if fields[key] % tp:
            fix = "choose tp dividing " + key + (", or --no-sequence-parallel"
                                                 if key == "seq_length" else "")
            raise UserError(f"model.{key}", f"{fields[key]} does not divide by tp ({tp}): "
                            f"{what} over the tensor ranks", fix)


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


def check_tied(problem: Any, builder: Any) -> None:
    """A tied model runs as Megatron runs it (ppsim.executor.tied), on either engine, where
    the builder ties its head to its embedding (the shipped ones do as the config says;
    one of your own where it declares `tie_embeddings`); a builder that ties other than
    the config says is refused. `builder`: None with --print-launch (no code loads)."""
    tied = bool(problem.costs.tied.params)
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
