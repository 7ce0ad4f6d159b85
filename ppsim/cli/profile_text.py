"""A cost file `ppsim profile` measured, as text for a person: the per-piece table, the
links, the collectives and the conditions it was measured under."""

from __future__ import annotations

from typing import Any

from ppsim.cli.costs import COSTS_NOTE, costs_table
from ppsim.units import fmt_bytes


def layer_rows(layers: list[dict[str, Any]]) -> list[tuple[str, str, dict[str, Any]]]:
    """One row a distinct layer cost (each kind the profile measured): its first layer,
    and how many share it where the kinds differ."""
    groups: dict[str, list[int]] = {}
    for i, x in enumerate(layers):
        groups.setdefault(repr(sorted(x.items())), []).append(i)
    if len(groups) == 1:
        return [("layer" if len(layers) == 1 else "layer 0", "", layers[0])]
    return [(f"layer {idx[0]} ×{len(idx)}", "", layers[idx[0]]) for idx in groups.values()]


def print_costs(doc: dict[str, Any], title: str) -> None:
    from rich.console import Console

    c = Console()
    c.print(costs_table(title, [("embedding", "", doc["embedding"]), *layer_rows(doc["layers"]),
                                ("head + loss", "", doc["head"])]))
    c.print(COSTS_NOTE)
    for line in (*_link_lines(doc), *_collective_lines(doc), *_condition_lines(doc)):
        c.print(line)


def _link_lines(doc: dict[str, Any]) -> list[str]:
    """The P2P link the file measured."""
    out = []
    p2p = doc.get("p2p")
    if p2p:
        out.append(f"P2P: latency {p2p['latency_ms'] * 1e3:.1f} us, bandwidth "
                   f"{p2p['bandwidth_gbps']:.2f} GB/s"
                   + (f" ({p2p['backend']})" if "backend" in p2p else ""))
    return out


def _collective_lines(doc: dict[str, Any]) -> list[str]:
    """The tensor-, expert- and context-parallel collectives inside the layers' F and B,
    then the data-parallel ones of the step."""
    coll, out = doc.get("collectives") or {}, []
    where = f"measured in {coll.get('processes', coll.get('tp'))} {coll.get('backend')} processes"
    if coll.get("copies", 1) > 1:  # beside the run's other pipeline ranks
        where += f", {coll['copies']} such groups at once"
    priced = "they price the simulated trace's"
    if "all_reduce_ms" in coll:
        out.append(f"tensor parallelism (tp {coll['tp']}): {where}; at "
                   f"{fmt_bytes(coll['bytes'])} all-reduce {coll['all_reduce_ms']:.3f} ms, "
                   f"all-gather {coll['all_gather_ms']:.3f} ms, reduce-scatter "
                   f"{coll['reduce_scatter_ms']:.3f} ms (inside each layer's F and B above; "
                   f"{priced})")
    if "all_to_all_ms" in coll:
        out.append(f"expert parallelism (ep {coll['ep']}): {where}; at "
                   f"{fmt_bytes(coll['all_to_all_bytes'])} all-to-all "
                   f"{coll['all_to_all_ms']:.3f} ms (the dispatch and the combine, inside each "
                   f"MoE layer's F and B above; {priced})")
    if "cp_bytes" in coll:
        ways = ", ".join(f"{label} {coll[key]:.3f} ms" for key, label in (
            ("cp_pass_ms", "a ring pass"), ("cp_all_to_all_ms", "all-to-all"),
            ("cp_all_gather_ms", "all-gather"), ("cp_reduce_scatter_ms", "reduce-scatter"))
            if key in coll)
        out.append(f"context parallelism (cp {coll['cp']}, {coll['cp_comm_type']}): {where}; "
                   f"at {fmt_bytes(coll['cp_bytes'])} (a microbatch's K and V) {ways} (inside "
                   f"each attention layer's F and B above; {priced})")
    if coll.get("etp", 1) not in (1, coll.get("tp")):
        out.append(f"routed experts split over etp {coll['etp']} ranks: {where} (their pairs "
                   "gathered and reduce-scattered inside each MoE layer's F and B above)")
    dpc = doc.get("dp_collectives")
    if dpc:
        big = dpc["samples"][-1]
        out.append(f"data parallelism: measured in {dpc['processes']} {dpc['backend']} "
                   f"processes (groups of {dpc['size']}); at {fmt_bytes(big['bytes'])} "
                   f"all-reduce {big['all_reduce_ms']:.3f} ms, reduce-scatter "
                   f"{big['reduce_scatter_ms']:.3f} ms, all-gather {big['all_gather_ms']:.3f} "
                   "ms (they price the step's reduce)")
    return out


def _condition_lines(doc: dict[str, Any]) -> list[str]:
    """What the run's conditions did to the measurement: processes at once, shared
    devices, the optimizer step, a host-mediated P2P link."""
    cond, out = doc.get("conditions") or {}, []
    if cond.get("processes", 1) > 1:
        solo = doc["measurement"]["solo"]["layer"]
        layer = doc["layers"][0]
        both = layer["forward_ms"] + layer["backward_ms"]
        alone = solo["forward_ms"] + solo["backward_ms"]
        out.append(f"op times measured in {cond['processes']} processes at once (placement "
                   f"{cond['devices']}): a layer's F+B {both:.3f} ms against {alone:.3f} ms "
                   f"alone; each gloo message costs {cond['message_cpu_ms'] * 1e3:.0f} us of "
                   "CPU at each end")
    if cond.get("shared"):
        sh = cond["shared"]
        out.append(f"{sh['ranks_per_device']} processes per device: a layer's F+B "
                   f"{sh['layer_fb_shared_ms']:.3f} ms against {sh['layer_fb_alone_ms']:.3f} "
                   f"ms alone (processor sharing: {sh['ranks_per_device']}x); context switch "
                   f"{cond['context_switch_ms'] * 1e3:.0f} us per op"
                   + (f"; a gloo message between two of them costs "
                      f"{cond['local_message_cpu_ms'] * 1e3:.0f} us of that device's CPU at "
                      "each end" if "local_message_cpu_ms" in cond else ""))
    opt = cond.get("optimizer")
    if opt:
        out.append(f"optimizer step (AdamW): {opt['fixed_ms']:.3f} ms + 28 B per parameter at "
                   f"{opt['gbps']:.1f} GB/s")
    host = (doc.get("measurement") or {}).get("p2p_host_mediated")
    if host:
        out.append(f"P2P: {host['bandwidth_gbps']:.2f} GB/s between two processes through the "
                   "host (one GPU, gloo): not an NVLink or InfiniBand figure, so the cost file "
                   "keeps none and the hardware preset's P2P applies")
    return out
