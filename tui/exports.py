"""Export the current split (Megatron / torchtitan / DeepSpeed).

The export file is a shell fragment: `source` it and pass "$MEGATRON_ARGS"
through `eval set --`, or read the variables with `read_export`.
"""

from __future__ import annotations

import json
import shlex

from ppsim.costs.hybrid import HybridPattern
from ppsim.errors import UserError
from ppsim.pipeline.exports import torchtitan_fqns
from ppsim.pipeline.hybrid_exports import exports_of
from ppsim.pipeline.split import Split
from ppsim.policy.megatron import PolicyExport


def export_forms(split: Split, pattern: HybridPattern | None = None,
                 group: int = 0) -> dict[str, object]:
    """All export forms of a split (ppsim.pipeline.hybrid_exports.exports_of: a hybrid
    stack's Megatron form is its pattern with `|`, and it has no layout); `group`: the
    interleaved order's microbatch group, passed where it is not Megatron's default.

    Megatron cannot express a V placement (ZB-V, DualPipeV); then only the
    torchtitan form is given and the others say why not."""

    try:
        return exports_of(pattern, split, group)
    except UserError as exc:
        forms: dict[str, object] = {
            "megatron_flags": None, "megatron_layout": None, "megatron_note": exc.problem,
            "deepspeed_boundaries": None, "deepspeed_note": exc.problem}
    try:
        forms["torchtitan_module_fqns_per_model_part"] = torchtitan_fqns(split)
    except UserError as exc:  # e.g. a stage with no module
        forms.update(torchtitan_module_fqns_per_model_part=None, torchtitan_note=exc.problem)
    return forms


def policy_export_lines(policy: PolicyExport) -> list[str]:
    """The memory policy's part of the export: Megatron's flags when its one setting
    for every stage says it (MEGATRON_POLICY_ARGS), what they need, who runs it."""
    runs = ", ".join(policy.frameworks) or "no framework as given"
    lines = [f"# memory policy runs on: {runs}"]
    if policy.megatron_flags is not None:
        lines.append("MEGATRON_POLICY_ARGS=" + shlex.quote(shlex.join(policy.megatron_flags)))
    return lines + [f"# {note}" for note in policy.notes]


def export_text(split: Split, title: str = "", policy: PolicyExport | None = None,
                pattern: HybridPattern | None = None, group: int = 0,
                notes: tuple[str, ...] = ()) -> str:
    """The export file's text: one shell variable per form (and the memory policy's
    flags when the state has one per stage); `pattern`: a hybrid stack's; `group` as
    for export_forms; `notes`: lines said as comments under the Megatron forms."""
    forms = export_forms(split, pattern, group)
    ds = forms["deepspeed_boundaries"]
    lines = [f"# ppsim split export{': ' + title if title else ''}",
             f"# pp={split.pp} vpp={split.vpp} placement={split.placement} "
             f"layers per virtual stage: {list(split.counts)}"]
    if forms["megatron_flags"] is not None:
        lines.append(f"MEGATRON_ARGS={shlex.quote(str(forms['megatron_flags']))}")
        if forms["megatron_layout"] is not None:
            layout = shlex.join(["--pipeline-model-parallel-layout",
                                 str(forms["megatron_layout"])])
            lines.append(f"MEGATRON_LAYOUT_ARGS={shlex.quote(layout)}")
        else:
            lines.append(f"# Megatron layout: n/a ({forms.get('megatron_layout_note')})")
    else:
        lines.append(f"# Megatron: n/a ({forms.get('megatron_note')})")
    lines += [f"# {note}" for note in notes]
    tt = forms["torchtitan_module_fqns_per_model_part"]
    if tt is not None:
        lines += ["# torchtitan: module_fqns_per_model_part",
                  "TORCHTITAN_FQNS=" + shlex.quote(json.dumps(tt))]
    else:
        lines.append(f"# torchtitan: n/a ({forms.get('torchtitan_note')})")
    if ds is not None:
        lines += ["# DeepSpeed PipelineModule(partition_method='custom') boundaries over "
                  "[embedding, layers..., head]",
                  "DEEPSPEED_BOUNDARIES=" + shlex.quote(json.dumps(ds))]
    else:
        lines.append(f"# DeepSpeed: n/a ({forms.get('deepspeed_note')})")
    if policy is not None:
        lines += policy_export_lines(policy)
    return "\n".join(lines) + "\n"


def read_export(text: str) -> dict[str, str]:
    """The variables of an export file (what `source` would set)."""
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or "=" not in line:
            continue
        name, _, value = line.partition("=")
        out[name] = shlex.split(value)[0] if value else ""
    return out


MEGATRON_TO_PPSIM = {
    "--num-layers": "--num-layers",
    "--pipeline-model-parallel-size": "--pp",
    "--num-virtual-stages-per-pipeline-rank": "--vpp",
    "--decoder-first-pipeline-num-layers": "--first-stage-layers",
    "--decoder-last-pipeline-num-layers": "--last-stage-layers",
    "--account-for-embedding-in-pipeline-split": "--account-for-embedding",
    "--account-for-loss-in-pipeline-split": "--account-for-loss",
    "--pipeline-model-parallel-layout": "--layout",
    "--microbatch-group-size-per-virtual-pipeline-stage": "--microbatch-group-size",
}


def megatron_to_ppsim_args(flags: list[str]) -> list[str]:
    """Megatron argv tokens as `ppsim split` flags (drops flags ppsim has no use for)."""
    out: list[str] = []
    keep = False
    for tok in flags:
        if tok.startswith("--"):
            mapped = MEGATRON_TO_PPSIM.get(tok)
            keep = mapped is not None
            if keep:
                out.append(mapped)
        elif keep:
            out.append(tok)
    return out
