"""A split in the forms other frameworks take: Megatron flags, torchtitan, DeepSpeed.

Every Megatron form parses in Megatron-LM's argument parser; forms a target
would refuse or could not run (V placement or pp 1 with vpp in Megatron, chunks
in DeepSpeed, an empty first stage in torch pipelining, MTP under pipeline
parallelism in torchtitan) raise UserError saying why, and `split_exports`
reports that as a note. Pure.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace
from typing import Any

from ppsim.errors import UserError
from ppsim.pipeline.layout import to_layout
from ppsim.pipeline.megatron_rules import GROUP_FLAG
from ppsim.pipeline.split import Split, megatron_split

TORCHTITAN_VERSION = "torchtitan main as of 2026-04-27 (PR #2937 renamed output to lm_head)"
"""The module names the torchtitan export uses."""
TORCHTITAN_HEAD = "lm_head"
"""torchtitan's output layer's module name (models/common/decoder.py: self.lm_head), as
its fqns and its converters' filter_fqns name it."""


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


def megatron_refusal(split: Split) -> str:
    """Why Megatron runs no split of `split`'s placement and shape at all, or ""."""
    try:
        _megatron_base(split)
    except UserError as exc:
        return exc.problem
    return ""


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


def _group_flag(split: Split, group: int) -> list[str]:
    """The interleaved group size flag, when the order's group is not Megatron's default."""
    if split.vpp > 1 and group and group != split.pp:
        return [GROUP_FLAG, str(group)]
    return []


def megatron_layout_flag(split: Split, group: int = 0) -> list[str]:
    """Megatron argv tokens that give `split` through the layout flag (`group`: the
    order's microbatch group, 0 for none)."""
    return (_megatron_base(split) + ["--pipeline-model-parallel-layout", to_layout(split)]
            + _group_flag(split, group))


def megatron_flags(split: Split, group: int = 0) -> list[str]:
    """The shortest Megatron argv tokens that build exactly `split` (and, with vpp,
    the order's microbatch `group` when it is not Megatron's default, pp).

    Tries the even split and every first/last and account-for-embedding/loss option,
    fewest tokens first, and falls back to the layout flag, which can say anything.
    """
    base = _megatron_base(split)
    plain = _decoder_only(split)
    if plain is None:
        return megatron_layout_flag(split, group)
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
                return base + vpp_flag + flags + _group_flag(split, group)
        except UserError:
            continue
    return megatron_layout_flag(split, group)


def torchtitan_fqns(split: Split) -> list[list[str]]:
    """torchtitan's module_fqns_per_model_part: module names per virtual stage.

    torchtitan keeps the listed modules of each part and sets every other one to
    None, so the head must be named as torchtitan names it (`lm_head`, see
    TORCHTITAN_VERSION) or the last stage would return hidden states. Refused where
    torch pipelining or torchtitan cannot run the split: the embedding off stage 0
    (torch feeds token ids to stage 0 only), MTP layers with more than one stage
    (torchtitan's deepseek_v3/mtp.py: "MTP does not support pipeline parallelism yet"), a
    stage with no module (torchtitan's OptimizersContainer builds each model part's
    param groups and raises on one that matches no parameter).
    """
    if split.embedding_stage != 0:
        raise UserError("pipeline.layout", f"stage 0 is empty and the embedding is on stage "
                        f"{split.embedding_stage}: torch pipelining feeds token ids to stage "
                        "0 only", "put the embedding on the first stage ('E' first)")
    if split.mtp and split.num_stages > 1:
        raise UserError("model.mtp_layers", "torchtitan rejects MTP under pipeline "
                        "parallelism (deepseek_v3/mtp.py)", "export without MTP layers")
    parts = []
    for st in split.stages:
        names = ["tok_embeddings"] if st.has_embedding else []
        names += [f"layers.{k}" for k in range(st.offset, st.offset + st.layers - st.mtp)]
        names += ["norm", TORCHTITAN_HEAD] if st.has_head else []
        if not names:
            raise UserError("pipeline.split", f"stage {st.index} holds no module, and "
                            "torchtitan builds an optimizer for each model part, which "
                            "refuses one with no parameters (its param_groups pattern "
                            "'matched no parameters')", "give every stage a layer")
        parts.append(names)
    return parts


@dataclass(frozen=True, kw_only=True)
class DeepSpeedSpecs:
    """The shape of a DeepSpeed PipelineModule's layer-spec list around the decoder layers.

    DeepSpeed's boundaries index that list, so every entry before the first decoder
    layer shifts them: Megatron-DeepSpeed's GPT lists, for one, add a lambda after
    the embedding and a final norm and lambdas after the last layer.
    """

    before: int = 1
    """Entries before the first decoder layer, the embedding first."""
    after: int = 1
    """Entries after the last decoder layer, the head among them."""


DEFAULT_SPECS = DeepSpeedSpecs()
"""[embedding, layers..., head]: the list DeepSpeed's own GPT examples build."""


def parse_deepspeed_specs(text: str, field: str = "--deepspeed-specs") -> DeepSpeedSpecs:
    """BEFORE,AFTER (e.g. 2,4): the spec list's entries around the decoder layers."""
    parts = text.split(",")
    try:
        before, after = (int(x) for x in parts)
    except ValueError:
        raise UserError(field, f"{text!r} is not two counts BEFORE,AFTER",
                        "give e.g. 1,1 (embedding, head) or 2,4 (Megatron-DeepSpeed GPT)") from None
    if not (1 <= before <= 1000 and 1 <= after <= 1000):
        raise UserError(field, f"{text!r}: each count must be 1..1000 (the embedding and "
                        "the head are entries)", "give e.g. 1,1 or 2,4")
    return DeepSpeedSpecs(before=before, after=after)


def deepspeed_boundaries(split: Split, specs: DeepSpeedSpecs = DEFAULT_SPECS) -> list[int]:
    """DeepSpeed PipelineModule partition boundaries (its `parts`) over the spec list:
    `specs.before` entries, the decoder layers, `specs.after` entries."""
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
    inner = [specs.before + st.offset + st.layers for st in split.stages[:-1]]
    return [0, *inner, specs.before + split.num_layers + specs.after]


def deepspeed_override(bounds: list[int]) -> str:
    """The PipelineModule subclass that makes DeepSpeed use `bounds`: DeepSpeed has no
    public way to pass boundaries, and __init__ calls _partition_layers after setting
    stage_id (DeepSpeed edaa722 runtime/pipe/module.py)."""
    return ("class PlannedPipe(PipelineModule):\n"
            "    def _partition_layers(self, method=\"uniform\"):\n"
            f"        self.parts = {bounds}\n"
            "        self._set_bounds(start=self.parts[self.stage_id], "
            "stop=self.parts[self.stage_id + 1])\n")


def split_exports(split: Split, group: int = 0,
                  specs: DeepSpeedSpecs = DEFAULT_SPECS) -> dict[str, Any]:
    """Every export form of `split`; a form that does not exist is None with a note.
    `group`: the interleaved order's microbatch group (0: none); `specs`: the shape of
    the DeepSpeed spec list the boundaries index."""
    out: dict[str, Any] = {
        "megatron_layout": to_layout(split),
        "torchtitan_version": TORCHTITAN_VERSION,
    }
    forms = (("megatron_flags", "megatron", lambda: shlex.join(megatron_flags(split, group))),
             ("torchtitan_module_fqns_per_model_part", "torchtitan",
              lambda: torchtitan_fqns(split)),
             ("deepspeed_boundaries", "deepspeed", lambda: deepspeed_boundaries(split, specs)))
    for key, target, make in forms:
        try:
            out[key] = make()
        except UserError as exc:
            out[key] = None
            out[f"{target}_note"] = exc.problem
    # The forms that follow from the boundaries are null with them: every key always there.
    bounds = out["deepspeed_boundaries"]
    out["deepspeed_specs"] = ({"before": specs.before, "after": specs.after}
                              if bounds is not None else None)
    out["deepspeed_partition_override"] = deepspeed_override(bounds) if bounds is not None \
        else None
    return out
