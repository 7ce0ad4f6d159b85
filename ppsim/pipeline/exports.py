"""A split in the forms other frameworks take: Megatron flags, torchtitan, DeepSpeed.

Every Megatron form parses in Megatron-LM's argument parser; forms that do not
exist for a split (V placement in Megatron, chunks in DeepSpeed) raise UserError
saying why, and `split_exports` reports that as a note. Pure.
"""

from __future__ import annotations

import shlex
from dataclasses import replace
from typing import Any

from ppsim.errors import UserError
from ppsim.pipeline.layout import to_layout
from ppsim.pipeline.split import Split, megatron_split

TORCHTITAN_VERSION = "torchtitan main as of 2026-04-27 (PR #2937 renamed output to lm_head)"
"""The module names the torchtitan export uses."""


def _megatron_base(split: Split) -> list[str]:
    if split.placement != "loop":
        raise UserError(
            "pipeline.placement",
            f"Megatron places virtual stages in loop order, not {split.placement!r}",
            "use placement 'loop' for a Megatron export",
        )
    if split.pp == 1 and split.vpp > 1:
        raise UserError(
            "pipeline.vpp", f"Megatron needs pp >= 2 for vpp={split.vpp}", "use vpp = 1"
        )
    base = ["--num-layers", str(split.decoder_layers),
            "--pipeline-model-parallel-size", str(split.pp)]
    # Megatron overlaps P2P by default with the interleaved schedule; it has no
    # --overlap-p2p-comm flag to pass (only --no-overlap-p2p-communication).
    if split.mtp:
        base += ["--mtp-num-layers", str(split.mtp)]
    return base


def _decoder_only(split: Split) -> Split | None:
    """The split without its MTP layers when Megatron's own rule places them
    (all on the last stage, with the loss); None when only a layout can say it."""
    if not split.standard_ends:
        return None
    if split.mtp == 0:
        return split
    counts = list(split.counts)
    if counts[-1] < split.mtp:
        return None
    counts[-1] -= split.mtp
    return replace(split, counts=tuple(counts), mtp=0)


def megatron_layout_flag(split: Split) -> list[str]:
    """Megatron argv tokens that give `split` through the layout flag."""
    return _megatron_base(split) + ["--pipeline-model-parallel-layout", to_layout(split)]


def megatron_flags(split: Split) -> list[str]:
    """The shortest Megatron argv tokens that build exactly `split`.

    Tries the even split and every first/last and account-for-embedding/loss option,
    fewest tokens first, and falls back to the layout flag, which can say anything.
    """
    base = _megatron_base(split)
    plain = _decoder_only(split)
    if plain is None:
        return megatron_layout_flag(split)
    L, pp, vpp = plain.num_layers, split.pp, split.vpp
    vpp_flag = ["--num-virtual-stages-per-pipeline-rank", str(vpp)] if vpp > 1 else []
    first, last = plain.rank_layers(0), plain.rank_layers(pp - 1)
    candidates: list[tuple[dict[str, object], list[str]]] = [({}, [])]
    for f, la in ((first, None), (None, last), (first, last)):
        if pp == 2 and vpp > 1 and f is not None and la is not None:
            continue  # Megatron divides by zero here; the layout flag is safe
        flags = []
        if f is not None:
            flags += ["--decoder-first-pipeline-num-layers", str(f)]
        if la is not None:
            flags += ["--decoder-last-pipeline-num-layers", str(la)]
        candidates.append(({"first_stage_layers": f, "last_stage_layers": la}, flags))
    for e, lo in ((True, False), (False, True), (True, True)):
        flags = ["--account-for-embedding-in-pipeline-split"] * e
        flags += ["--account-for-loss-in-pipeline-split"] * lo
        candidates.append(({"account_for_embedding": e, "account_for_loss": lo}, flags))
    for options, flags in sorted(candidates, key=lambda c: len(c[1])):  # stable: shortest first
        try:
            if megatron_split(L, pp, vpp, **options) == plain:  # type: ignore[arg-type]
                return base + vpp_flag + flags
        except UserError:
            continue
    return megatron_layout_flag(split)


def torchtitan_fqns(split: Split) -> list[list[str]]:
    """torchtitan's module_fqns_per_model_part: module names per virtual stage.

    torchtitan keeps the listed modules of each part and sets every other one to
    None, so the head must be named as torchtitan names it (`lm_head`, see
    TORCHTITAN_VERSION) or the last stage would return hidden states. torchtitan's
    models have no MTP module, so MTP layers are left out.
    """
    parts = []
    for st in split.stages:
        names = ["tok_embeddings"] if st.has_embedding else []
        names += [f"layers.{k}" for k in range(st.offset, st.offset + st.layers - st.mtp)]
        names += ["norm", "lm_head"] if st.has_head else []
        parts.append(names)
    return parts


def deepspeed_boundaries(split: Split) -> list[int]:
    """DeepSpeed PipelineModule partition boundaries over [embedding, layers..., head]."""
    if split.vpp > 1:
        raise UserError(
            "pipeline.vpp",
            f"DeepSpeed runs one stage per rank, but vpp={split.vpp}",
            "use vpp = 1 for a DeepSpeed export",
        )
    empty = [st.index for st in split.stages[1:-1] if st.layers == 0]
    if empty:
        raise UserError(
            "pipeline.split",
            f"stage {empty[0]} has no layers, and DeepSpeed cannot run an empty stage",
            "give every middle stage at least one layer",
        )
    if not split.standard_ends:
        raise UserError("pipeline.layout", "DeepSpeed puts the embedding on the first stage "
                        "and the head on the last", "use a split without empty end stages")
    # Spec 0 is the embedding, spec k + 1 decoder layer k, spec L + 1 the head.
    return [0] + [1 + st.offset + st.layers for st in split.stages[:-1]] + [split.num_layers + 2]


def split_exports(split: Split) -> dict[str, Any]:
    """Every export form of `split`; a form that does not exist is None with a note."""
    out: dict[str, Any] = {
        "megatron_layout": to_layout(split),
        "torchtitan_module_fqns_per_model_part": torchtitan_fqns(split),
        "torchtitan_version": TORCHTITAN_VERSION,
    }
    try:
        out["megatron_flags"] = shlex.join(megatron_flags(split))
    except UserError as exc:
        out["megatron_flags"] = None
        out["megatron_note"] = exc.problem
    try:
        out["deepspeed_boundaries"] = deepspeed_boundaries(split)
    except UserError as exc:
        out["deepspeed_boundaries"] = None
        out["deepspeed_note"] = exc.problem
    return out
