"""`ppsim presets [NAME]`: the model and hardware presets; a model's Megatron arguments,
a hardware preset's [hardware] table."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
from typing import Any

from ppsim.cli.flags import emit_json
from ppsim.cli.megatron_args import megatron_model_args
from ppsim.cli.render import compact_table
from ppsim.config.model import TransformerModel, parse_model
from ppsim.config.presets import HARDWARE_NOTES, HARDWARE_PRESETS, MODEL_NOTES, MODEL_PRESETS
from ppsim.config.schema import hardware_config
from ppsim.config.to_toml import section_toml
from ppsim.errors import UserError, one_of


def cmd_presets(args: argparse.Namespace) -> int:
    from rich.console import Console

    if args.name is not None:
        return _one_preset(args.name, args.json)
    if args.json:
        emit_json({"models": MODEL_PRESETS, "hardware": HARDWARE_PRESETS})
        return 0
    console = Console()
    models = [[name, str(m["num_layers"]), str(m["hidden_size"]),
               f"{m['num_heads']}/{m['num_kv_heads']}", str(m["ffn_hidden_size"]),
               str(m["vocab_size"]), str(m["seq_length"]), str(m.get("tp", 1))]
              for name, m in MODEL_PRESETS.items()]
    _preset_table(console, "model presets", ["name", "layers", "hidden", "heads/kv", "ffn",
                                             "vocab", "seq", "tp"], models, MODEL_NOTES)
    hardware = [[name, f"{hw['memory_bytes'] / 1e9:.0f} GB", f"{hw['peak_tflops']:g}",
                 "/".join(f"{hw[k]:g}" if hw.get(k) else "-" for k in ("fp8_peak_tflops",
                                                                      "fp4_peak_tflops")),
                 f"{hw['efficiency']:.3g}", f"{hw['p2p_bandwidth_gbps']:g}",
                 str(hw.get("gpus_per_node", "-")),
                 f"{hw.get('intra_node_bandwidth_gbps', 0):g}",
                 f"{hw.get('inter_node_bandwidth_gbps', 0):g}"]
                for name, hw in HARDWARE_PRESETS.items()]
    _preset_table(console, "hardware presets", ["name", "memory", "peak\nTFLOP/s",
                                                "FP8/FP4\nTFLOP/s", "matmul\neff.",
                                                "P2P\nGB/s", "GPUs\nper node", "NVLink\nGB/s",
                                                "NIC\nGB/s"], hardware, HARDWARE_NOTES)
    console.print("ppsim presets NAME: a model's Megatron arguments, a hardware preset's "
                  "[hardware] table", markup=False)
    return 0


def _one_preset(name: str, as_json: bool) -> int:
    """A model preset's fields and its Megatron arguments (ppsim.cli.megatron_args), or a
    hardware preset's [hardware] table."""
    if name in HARDWARE_PRESETS:
        return _one_hardware(name, as_json)
    if name not in MODEL_PRESETS:
        raise UserError("NAME", f"{name!r} is not a preset",
                        one_of(name, [*MODEL_PRESETS, *HARDWARE_PRESETS]))
    model = parse_model({"preset": name})
    assert isinstance(model, TransformerModel)  # every model preset is a transformer
    args = shlex.join(megatron_model_args(model.arch))
    dp = model.arch.dp  # the world's: Megatron has no argument for it
    if as_json:
        emit_json({"name": name, "fields": model.fields(), "note": MODEL_NOTES[name],
                   "megatron_model_args": args, "dp": dp})
        return 0
    print(f"{name}: {MODEL_NOTES[name]}")
    print(f"Megatron: {args}")
    if dp > 1:
        print(f"data-parallel size {dp}: Megatron takes it from the world size; pasting the "
              f"arguments above into ppsim, add --dp {dp} (or --gpus)")
    return 0


def _one_hardware(name: str, as_json: bool) -> int:
    """A hardware preset as the [hardware] table a config may copy and change."""
    hw = hardware_config({"preset": name})
    if as_json:
        emit_json({"name": name, "fields": dataclasses.asdict(hw),
                   "note": HARDWARE_NOTES[name]})
        return 0
    # comments, so `ppsim presets NAME > hw.toml` is a file --hardware and --config read
    print(f"# {name}: {HARDWARE_NOTES[name]} (sources: docs/model.md)")
    print("# as a config's [hardware] table (copy it and change what differs):\n")
    print("\n".join(section_toml("hardware", hw)))
    return 0


def _preset_table(console: Any, title: str, columns: list[str], rows: list[list[str]],
                  notes: dict[str, str]) -> None:
    """The presets' figures one line each (names whole, at 80 columns too), then each
    preset's note under the table, wrapped to the terminal."""
    from rich.table import Table

    t = compact_table(title)
    for i, col in enumerate(columns):
        t.add_column(col, justify="left" if i == 0 else "right", no_wrap=True)
    for row in rows:
        t.add_row(*row)
    console.print(t)
    console.print()
    notes_table = Table.grid(padding=(0, 2))
    notes_table.add_column(no_wrap=True, style="bold")
    notes_table.add_column()
    for row in rows:
        notes_table.add_row(row[0], notes[row[0]])
    console.print(notes_table)
    console.print()


def register(commands: dict[str, Any]) -> None:
    def presets(p: argparse.ArgumentParser) -> None:
        p.add_argument("name", metavar="NAME", nargs="?", help="a model preset: its "
                       "Megatron arguments (the model, its precision, recompute, tp and "
                       "ep); a hardware preset: its [hardware] table")
        p.add_argument("--json", action="store_true", help="one JSON object on stdout")

    commands["presets"] = ("list model and hardware presets", presets, cmd_presets)
