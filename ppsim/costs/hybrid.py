"""Megatron's hybrid layer pattern: parsed and refused as Megatron-LM does.

A pattern names one layer per symbol (Megatron-LM
megatron/core/models/hybrid/hybrid_layer_allocation.py, class Symbols): `M` Mamba-2,
`G` GatedDeltaNet, `*` attention, `D` DeepSeek sparse attention, `+` MLA, `-` MLP,
`E` MoE; `|` splits the main pattern into pipeline segments and `/` starts the
multi-token-prediction (MTP) pattern, once per depth. The rules, restated from
`parse_hybrid_pattern`, `_validate_pattern`, `select_pipeline_segment` and
megatron/training/arguments.py (commit d98e8a6):

- split on `/`: the first part is the main pattern, the rest one MTP pattern per
  depth. No MTP part, or only empty ones ("M*/", "M*//"), means no MTP.
- every MTP part must equal the first one ("M*/MM/M" and "M*//MM" are refused).
- the main pattern takes the layer symbols and `|`; an MTP pattern the layer
  symbols only. Any other character is refused.
- within one pattern (main, or the MTP one), `*` cannot appear with `D` or `+`.
- the main pattern's layers (pipes removed) are --num-layers, the depths
  --mtp-num-layers; both replace any value given (Megatron warns and goes on).
- with `|`: the segment count must divide by pp; segments / pp is vpp (segment
  k runs on rank k mod pp, chunk k div pp), so pp = 1 is refused (vpp > 1 needs
  pp > 1); the first/last-stage counts, the layout flag, account-for-embedding/loss
  and the per-rank vpp flags are refused.
- without `|` and pp > 1: no vpp; the layers divide evenly by pp, or follow the
  first/last-stage counts (the middle ranks again evenly). ppsim's own splits go
  further (any vpp, the planner's counts); the export is then the pattern with `|`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ppsim.errors import UserError

FIELD = "model.hybrid_layer_pattern"

SYMBOL_KINDS = {"M": "mamba", "G": "gdn", "*": "attention", "D": "dsa", "+": "mla",
                "-": "mlp", "E": "moe-mlp"}
"""Megatron's layer symbols and the layer kind each builds in ppsim's cost model."""
KIND_SYMBOLS = {kind: symbol for symbol, kind in SYMBOL_KINDS.items()}
PIPE = "|"
MTP_SEPARATOR = "/"


@dataclass(frozen=True, kw_only=True)
class HybridPattern:
    """A parsed --hybrid-layer-pattern."""

    segments: tuple[str, ...]
    """The main pattern split at `|` (one segment when it has no pipe)."""
    mtp: str = ""
    """The MTP pattern of one depth; empty: no MTP."""
    mtp_depths: int = 0
    """MTP depths (Megatron's --mtp-num-layers)."""

    @property
    def main(self) -> str:
        """The main decoder's symbols, pipes removed."""
        return "".join(self.segments)

    @property
    def has_pipes(self) -> bool:
        return len(self.segments) > 1

    @property
    def kinds(self) -> tuple[str, ...]:
        """The main decoder layers' kinds, in order."""
        return tuple(SYMBOL_KINDS[c] for c in self.main)

    @property
    def mtp_kinds(self) -> tuple[str, ...]:
        """The kinds one MTP depth runs, in order."""
        return tuple(SYMBOL_KINDS[c] for c in self.mtp)


def _check_symbols(part: str, name: str, allow_pipe: bool) -> None:
    allowed = set(SYMBOL_KINDS) | ({PIPE} if allow_pipe else set())
    for ch in part:
        if ch not in allowed:
            raise UserError(FIELD, f"in the {name} pattern, {ch!r} is not a layer symbol",
                            "use " + " ".join(sorted(allowed)) + " (Megatron's symbols)")
    if "*" in part and ("D" in part or "+" in part):
        raise UserError(FIELD, f"the {name} pattern mixes attention '*' with MLA/DSA "
                        "('+'/'D')", "Megatron builds one attention kind per pattern: "
                        "use '*' or '+'/'D'")


def parse_pattern(text: object) -> HybridPattern:
    """A pattern string as Megatron reads it; UserError where Megatron raises."""
    if not isinstance(text, str):
        raise UserError(FIELD, f"must be a string, got {type(text).__name__}",
                        "write e.g. hybrid_layer_pattern = \"M-M*-|M-M*-\"")
    main, *mtp_parts = text.split(MTP_SEPARATOR)
    _check_symbols(main, "main", allow_pipe=True)
    segments = tuple(main.split(PIPE))
    if all(p == "" for p in mtp_parts):
        return HybridPattern(segments=segments)
    first = mtp_parts[0]
    for i, part in enumerate(mtp_parts[1:], start=2):
        if part != first:
            raise UserError(FIELD, f"MTP pattern {i} is {part!r} but pattern 1 is {first!r}",
                            "repeat one MTP pattern per depth, e.g. \"M*M*/MM/MM\"")
    _check_symbols(first, "MTP", allow_pipe=False)
    return HybridPattern(segments=segments, mtp=first, mtp_depths=len(mtp_parts))


def pattern_layers(text: object) -> object:
    """A pattern without its `|` (what a cost file measured); other values as they are."""
    return text.replace(PIPE, "") if isinstance(text, str) else text


def pipe_counts(p: HybridPattern, pp: int) -> tuple[int, ...]:
    """Layers per virtual stage that the pattern's pipes give, in Megatron's order
    (segment k on rank k mod pp, chunk k div pp); MTP layers join the last stage."""
    if len(p.segments) % pp:
        raise UserError(FIELD, f"has {len(p.segments)} pipe-delimited segments, which do not "
                        f"divide by pp={pp}", "give pp x vpp segments (Megatron refuses this)")
    counts = [len(s) for s in p.segments]
    counts[-1] += p.mtp_depths
    return tuple(counts)


def check_pipeline(p: HybridPattern, pp: int, vpp: int, chosen: list[str]) -> None:
    """Refuse what Megatron's arguments refuse beside a pattern with `|`: other split
    options, a vpp other than the pattern's, one rank. Without `|` ppsim chooses the
    split (vpp included) and its export writes the `|` Megatron needs."""
    if p.has_pipes and chosen:
        raise UserError(FIELD, "has '|' stage boundaries and the pipeline also sets "
                        + ", ".join(chosen), "drop one: Megatron takes the split from the "
                        "pattern's '|' alone")
    if p.has_pipes and pp == 1:
        raise UserError(FIELD, f"has {len(p.segments)} segments on pp=1, which makes vpp "
                        f"{len(p.segments)}: Megatron's interleaved schedule needs pp > 1",
                        "drop the '|' or use pp >= 2")
    if p.has_pipes and vpp not in (1, len(p.segments) // pp):
        raise UserError("pipeline.vpp", f"is {vpp} but the pattern has {len(p.segments)} "
                        f"segments = {len(p.segments) // pp} per rank",
                        f"set vpp = {len(p.segments) // pp} or leave it out")


def with_pipes(p: HybridPattern, counts: tuple[int, ...], mtp_on_last: int) -> str:
    """The pattern with `|` where a split's virtual stages end (counts in Megatron's
    stage order, MTP layers counted on the last stage), MTP part kept."""
    main, out, at = p.main, [], 0
    for i, n in enumerate(counts):
        n -= mtp_on_last if i == len(counts) - 1 else 0
        out.append(main[at:at + n])
        at += n
    if at != len(main):
        raise UserError("pipeline.split", f"covers {at} layers but the pattern has {len(main)}",
                        "give a split over the pattern's layers")
    mtp = "".join(MTP_SEPARATOR + p.mtp for _ in range(p.mtp_depths))
    return PIPE.join(out) + mtp


def model_counts(fields: dict[str, object]) -> dict[str, int]:
    """num_layers and mtp_layers of a [model] table with a pattern: the pattern's, as
    Megatron derives --num-layers and --mtp-num-layers from it. Refuses what the
    pattern cannot build from the table (a `layers` spec beside it, MoE without
    experts)."""
    p = parse_pattern(fields["hybrid_layer_pattern"])
    if str(fields.get("layers") or "").strip():
        raise UserError("model.layers", f"is set beside {FIELD}",
                        "the pattern names every layer: drop layers")
    if "E" in p.main + p.mtp and not all(fields.get(k) for k in
                                          ("num_experts", "top_k", "moe_ffn_hidden_size")):
        raise UserError("model.num_experts", "MoE layers ('E') need routed experts", "set "
                        "num_experts (top_k and moe_ffn_hidden_size default to Megatron's 2 "
                        "and the dense width)")
    return {"num_layers": len(p.main), "mtp_layers": p.mtp_depths}
