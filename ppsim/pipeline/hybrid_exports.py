"""A split of a hybrid stack as Megatron takes it: the pattern with `|` at its stages.

Megatron refuses the layout and first/last-stage flags beside a pattern with pipes
(ppsim.costs.hybrid), so for a hybrid model the pattern itself is the export:
segment k runs on rank k mod pp as chunk k div pp (loop order), MTP on the last
stage with the loss, and vpp follows from the segment count. Pure.
"""

from __future__ import annotations

import shlex
from typing import Any

from ppsim.costs.hybrid import HybridPattern, with_pipes
from ppsim.errors import UserError
from ppsim.pipeline.exports import DEFAULT_SPECS, DeepSpeedSpecs, split_exports
from ppsim.pipeline.split import Split

LAYOUT_NOTE = ("Megatron takes no --pipeline-model-parallel-layout beside "
               "--hybrid-layer-pattern: the pattern's | give the split")
"""Why a hybrid model has no layout export (Megatron's assertion in arguments.py)."""


def piped_pattern(p: HybridPattern, split: Split) -> str:
    """The pattern with `|` where `split`'s virtual stages end; UserError where
    Megatron cannot build the split from a pattern."""
    if split.placement != "loop":
        raise UserError("pipeline.placement", f"Megatron places pattern segments in loop "
                        f"order, not {split.placement!r}", "use a loop-placed schedule")
    if split.pp == 1 and split.vpp > 1:
        raise UserError("pipeline.vpp", f"Megatron needs pp >= 2 for vpp={split.vpp}",
                        "use vpp = 1")
    if not split.standard_ends:
        raise UserError("pipeline.layout", "a pattern keeps the embedding on the first "
                        "stage and the loss on the last", "use a split with standard ends")
    if split.mtp and split.counts[-1] < split.mtp:
        raise UserError("pipeline.split", "Megatron builds every MTP depth on the last "
                        "stage", f"give the last stage at least {split.mtp} layers")
    return with_pipes(p, split.counts, split.mtp)


def hybrid_exports(p: HybridPattern, split: Split) -> dict[str, Any]:
    """The pattern export and the Megatron flags that build `split` (None with a note
    when Megatron cannot); these flags replace the layout-based ones."""
    no_layout = {"megatron_layout": None, "megatron_layout_note": LAYOUT_NOTE}
    try:
        piped = piped_pattern(p, split)
    except UserError as exc:
        return {"hybrid_layer_pattern": None, "megatron_flags": None,
                "megatron_note": exc.problem, **no_layout}
    flags = ["--hybrid-layer-pattern", piped, "--pipeline-model-parallel-size", str(split.pp)]
    return {"hybrid_layer_pattern": piped, "megatron_flags": shlex.join(flags), **no_layout}


def exports_of(pattern: HybridPattern | None, split: Split, group: int = 0,
               specs: DeepSpeedSpecs = DEFAULT_SPECS) -> dict[str, Any]:
    """Every export of a split (ppsim.pipeline.exports.split_exports); a hybrid model's
    Megatron flags are its piped pattern, and it has no layout."""
    out = split_exports(split, group, specs)
    if pattern is not None:
        out.update(hybrid_exports(pattern, split))
    return out
