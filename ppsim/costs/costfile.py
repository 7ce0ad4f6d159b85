"""Measured cost files: what `ppsim profile` and `ppsim calibrate` write, `--costs` reads.

A cost file is one JSON object:

    {"format": "ppsim-costs", "version": 1,
     "source": "profile" | "calibrate" | "hand",
     "model": {architecture fields the numbers were measured for} | null,
     "device": "cpu", "torch_version": "2.x", ...           (provenance, free-form)
     "layers": [{LayerCost fields}, ...],                    one entry per decoder layer,
                                                             or one entry for every layer
     "mtp": [{LayerCost fields}, ...],                       (optional: MTP layers, one
                                                             entry each or one for all)
     "embedding": {LayerCost fields}, "head": {LayerCost fields},
     "tied": {"static_bytes": n, "params": n},               (optional: a tied table as
                                                             the head holds it, held once
                                                             where one rank has both ends)
     "p2p": {"latency_ms": x, "bandwidth_gbps": y, ...} | null,
     "dp_collectives": {"size": n, "samples": [{"bytes": b, "all_reduce_ms": t,
                        "reduce_scatter_ms": t, "all_gather_ms": t}, ...]}   (optional:
                                                             ppsim.costs.grouptimes)
     "collectives": {"tp": n, "bytes": b, "all_reduce_ms": t, ...,   (optional: in-layer
                     "ep": n, "all_to_all_bytes": b, "all_to_all_ms": t,   collectives
                     "cp": n, "cp_comm_type": c, "cp_bytes": b,            timed bare)
                     "cp_pass_ms": t, ...},
     "conditions": {"devices": [0, 1], "processes": 2, "cores": 2,       (optional: what
                    "message_cpu_ms": x, "context_switch_ms": y,          the run adds, as
                    "local_message_cpu_ms": w, "iteration_boundary_ms": z,
                    "optimizer": {"fixed_ms": a, "gbps": b}} | null,     measured)
     "measurement": {...}, "calibration": {...}}             (how the numbers were obtained)

LayerCost fields are forward_ms, backward_ms (whole backward), weight_grad_ms (the
part of backward_ms that a split-backward schedule runs as W), split_backward_ms (the
whole backward when W runs apart; 0: backward_ms), static_bytes, activation_bytes,
weight_grad_bytes, transient_bytes (what the backward holds while it runs; `ppsim
profile` on CPU cannot see it: 0), output_bytes, params and expert_params (routed
experts' among params); a missing one is 0.

Pure logic: no torch import, so planning with a measured file works anywhere.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from ppsim.config import files, limits
from ppsim.costs.conditions import Conditions, conditions_from_dict, number_field
from ppsim.costs.costgroups import check_groups
from ppsim.costs.grouptimes import GroupTimes, TimedGroup, group_times_from_dict, in_layer_times
from ppsim.costs.hybrid import pattern_layers
from ppsim.costs.model import INTEGER_FIELDS, LAYER_FIELDS, LayerCost, ModelCosts
from ppsim.costs.transformer import Architecture
from ppsim.errors import UserError
from ppsim.fileio import write_json_atomic

MAX_CONTAINERS = 3 * limits.MAX_LAYERS + 10_000
"""JSON objects and arrays a cost file may hold: a layer entry each (decoder and MTP
layers, at most limits.MAX_LAYERS), and room for provenance and calibration notes."""
FORMAT = "ppsim-costs"
VERSION = 1
PROFILE_REPEATS = 20
"""`ppsim profile --repeats`' default, timed repeats per op: from it on the run's
conditions take their full message and latency samples, fewer repeats fewer of them."""

# Architecture fields that change a layer's time or bytes. num_layers is left
# out: one layer's measurement applies to a model of any depth.
SHAPE_KEYS = ("hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size", "vocab_size",
              "seq_length", "micro_batch_size", "gated_mlp", "dtype", "tp", "recompute",
              "distributed_optimizer", "fsdp", "dp_replicas", "dp", "hybrid_layer_pattern",
              "mamba_state_dim", "mamba_head_dim", "mamba_num_groups", "mamba_num_heads",
              "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
              "linear_value_head_dim", "linear_conv_kernel_dim", "unfused_attention",
              "pad_vocab", "qk_layernorm", "attention_output_gate", "shared_expert_gate",
              "experimental_attention_variant", "linear_attention_freq",
              "moe_permute_fusion", "sequence_parallel", "fp32_residual", "num_experts",
              "ep", "etp", "cp", "cp_comm_type", "cp_a2a_size", "layers", "top_k",
              "moe_ffn_hidden_size", "shared_experts", "shared_expert_ffn_hidden_size",
              "attention", "head_dim", "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim",
              "v_head_dim", "attention_window", "vocab_divisor", "gated_activation",
              "linear_bias", "norm", "position", "max_position_embeddings", "dropout",
              "loss_chunks", "window_attn_skip_freq", "dsa_indexer_n_heads",
              "dsa_indexer_head_dim", "dsa_indexer_topk", "moe_latent_size",
              "moe_capacity_factor", "moe_pad_to_capacity",
              # the GEMMs' precision, the fusions, and the state a rank keeps (static bytes)
              "fp8", "fp8_recipe", "fp8_param_gather", "first_last_layers_bf16",
              "num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16",
              "bias_swiglu_fusion", "gradient_accumulation_fusion", "grad_reduce_in_bf16",
              "grads_in_fp32", "optimizer", "muon_tp_mode", "precision_aware_optimizer",
              "main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype",
              "optimizer_cpu_offload", "optimizer_offload_fraction", "fsdp_framework",
              "fsdp_cpu_offload", "fsdp_reshard_after_forward")


@dataclass(frozen=True)
class CostFile:
    """A parsed cost file; `layers` may hold one entry meant for every layer."""

    path: str
    layers: tuple[LayerCost, ...]
    embedding: LayerCost
    head: LayerCost
    model: dict[str, Any] | None
    p2p_latency_ms: float | None
    p2p_bandwidth_gbps: float | None
    raw: dict[str, Any]
    conditions: Conditions | None = None
    mtp: tuple[LayerCost, ...] = ()
    """MTP layers' costs (one entry each, or one for all); empty: the file has none."""
    dp_collectives: GroupTimes | None = None
    """The data-parallel group's collectives as timed on it (ppsim.costs.grouptimes)."""
    in_layer: tuple[TimedGroup, ...] = ()
    """The tensor-, expert- and context-parallel groups' collectives, timed bare."""
    tied: LayerCost = field(default_factory=LayerCost)
    """A tied table's measured bytes (ModelCosts.tied); none where the model is untied."""

    @property
    def timed_groups(self) -> tuple[TimedGroup, ...]:
        """Every group the file timed, the data-parallel ones as "dp"."""
        dp = (TimedGroup(group="dp", times=self.dp_collectives),) if self.dp_collectives \
            else ()
        return dp + self.in_layer

    def model_costs(self, num_layers: int | None = None, mtp_layers: int = 0) -> ModelCosts:
        """The costs for a model of num_layers decoder layers (None: as many as the file
        lists) followed by mtp_layers MTP layers."""
        layers = _sized(self.path, "layers", self.layers, num_layers, "model.num_layers",
                        "profile this model (ppsim profile), or write one entry to apply "
                        "to every layer")
        if not mtp_layers:
            return ModelCosts(layers=layers, embedding=self.embedding, head=self.head,
                              tied=self.tied)
        if not self.mtp:
            raise UserError(f"{self.path}: mtp", f"the file has no MTP entries but the model "
                            f"has {mtp_layers} MTP layers", "calibrate on a trace of this "
                            "model, or add \"mtp\": [{...}] with one entry for every MTP layer")
        mtp = _sized(self.path, "mtp", self.mtp, mtp_layers, "model.mtp_layers",
                     "write one entry per MTP layer, or one for all")
        return ModelCosts(layers=layers + mtp, embedding=self.embedding, head=self.head,
                          kinds=("layer",) * len(layers) + ("mtp",) * mtp_layers,
                          mtp_layers=mtp_layers, tied=self.tied)


def _sized(path: str, key: str, entries: tuple[LayerCost, ...], want: int | None,
           field: str, fix: str) -> tuple[LayerCost, ...]:
    """`want` entries: the file's own, or its one entry repeated."""
    if want is None or len(entries) == want:
        return entries
    if len(entries) != 1:
        raise UserError(f"{path}: {key}", f"has {len(entries)} entries but {field} is {want}",
                        fix)
    return entries * want


# ------------------------------------------------------------------ writing


def layer_dict(c: LayerCost) -> dict[str, Any]:
    """A layer's measured costs (what the job prices stays out: PRICED_FIELDS)."""
    return {k: v for k, v in asdict(c).items() if k in LAYER_FIELDS}


def cost_document(costs: ModelCosts, *, source: str, model: dict[str, Any] | None,
                  p2p: dict[str, Any] | None = None, uniform: bool | None = None,
                  **extra: Any) -> dict[str, Any]:
    """The JSON object of a cost file; `uniform` writes one layer entry (default: if all equal)."""
    decoder = len(costs.layers) - costs.mtp_layers
    layers, mtp = list(costs.layers[:decoder]), list(costs.layers[decoder:])
    if uniform is None:
        uniform = bool(layers) and all(x == layers[0] for x in layers)
    if uniform and layers:
        layers = layers[:1]
    if mtp and all(x == mtp[0] for x in mtp):
        mtp = mtp[:1]
    doc: dict[str, Any] = {"format": FORMAT, "version": VERSION, "source": source,
                           "model": dict(model) if model is not None else None, **extra,
                           "layers": [layer_dict(x) for x in layers],
                           "embedding": layer_dict(costs.embedding),
                           "head": layer_dict(costs.head), "p2p": p2p}
    if mtp:
        doc["mtp"] = [layer_dict(x) for x in mtp]
    if costs.tied.params:
        doc["tied"] = layer_dict(costs.tied)
    return doc


def write_costs(path: str, doc: dict[str, Any]) -> None:
    """Write atomically (a crash never leaves half a cost file), then re-read it to check."""
    with files.output("--out", path):
        write_json_atomic(path, doc)
    _CACHE.pop(os.path.abspath(path), None)
    read_cost_file(path)


# ------------------------------------------------------------------ reading


def _layer(path: str, where: str, table: Any) -> LayerCost:
    if not isinstance(table, dict):
        raise UserError(f"{path}: {where}", f"expected an object of {', '.join(LAYER_FIELDS)}, "
                        f"got {type(table).__name__}", "re-run ppsim profile")
    kw: dict[str, Any] = {}
    for key, value in table.items():
        if key not in LAYER_FIELDS:
            raise UserError(f"{path}: {where}.{key}", "unknown key",
                            "valid keys: " + ", ".join(LAYER_FIELDS))
        kw[key] = number_field(path, f"{where}.{key}", value, key in INTEGER_FIELDS)
    lc = LayerCost(**kw)
    if lc.split_backward_ms and lc.weight_grad_ms > lc.split_backward_ms * (1 + 1e-9):
        raise UserError(f"{path}: {where}.weight_grad_ms", f"{lc.weight_grad_ms} exceeds "
                        f"split_backward_ms {lc.split_backward_ms}",
                        "weight_grad_ms is the part of the backward spent on weights")
    if lc.weight_grad_ms > lc.backward_ms * (1 + 1e-9):
        raise UserError(f"{path}: {where}.weight_grad_ms", f"{lc.weight_grad_ms} exceeds "
                        f"backward_ms {lc.backward_ms}",
                        "weight_grad_ms is the part of backward_ms spent on weights")
    return lc


def cost_file_from_dict(data: Any, path: str = "costs") -> CostFile:
    """Check and parse a cost file's JSON; every problem is a UserError naming the field."""
    if not isinstance(data, dict):
        raise UserError(path, f"expected a JSON object, got {type(data).__name__}",
                        "pass a cost file written by ppsim profile or ppsim calibrate")
    if data.get("format") != FORMAT:
        raise UserError(f"{path}: format", f"expected {FORMAT!r}, got {data.get('format')!r}",
                        "pass a cost file written by ppsim profile or ppsim calibrate")
    if data.get("version") != VERSION:
        raise UserError(f"{path}: version", f"unsupported version {data.get('version')!r}",
                        f"this ppsim reads version {VERSION}; re-run ppsim profile")
    for key in ("layers", "embedding", "head"):
        if key not in data:
            raise UserError(f"{path}: {key}", "missing", "re-run ppsim profile")
    raw_layers = data["layers"]
    if not isinstance(raw_layers, list) or not raw_layers:
        raise UserError(f"{path}: layers", "must be a non-empty list of layer costs",
                        "one entry per decoder layer, or one entry for every layer")
    if len(raw_layers) > limits.MAX_LAYERS:
        raise UserError(f"{path}: layers", f"has {len(raw_layers):,} entries, above the limit "
                        f"of {limits.MAX_LAYERS:,}", "profile a model of fewer layers")
    layers = tuple(_layer(path, f"layers[{i}]", x) for i, x in enumerate(raw_layers))
    mtp = _mtp_entries(path, data.get("mtp"))
    check_groups(path, data, layers, mtp)
    emb = _layer(path, "embedding", data["embedding"])
    head = _layer(path, "head", data["head"])
    model = data.get("model")
    if model is not None and not isinstance(model, dict):
        raise UserError(f"{path}: model", "must be an object or null", "re-run ppsim profile")
    lat = bw = None
    p2p = data.get("p2p")
    if p2p is not None:
        if not isinstance(p2p, dict):
            raise UserError(f"{path}: p2p", "must be an object or null", "re-run ppsim profile")
        if "latency_ms" in p2p:
            lat = float(number_field(path, "p2p.latency_ms", p2p["latency_ms"], False))
        if "bandwidth_gbps" in p2p:
            bw = float(number_field(path, "p2p.bandwidth_gbps", p2p["bandwidth_gbps"], False))
    return CostFile(path, layers, emb, head, model, lat, bw, data,
                    conditions_from_dict(path, data.get("conditions")), mtp,
                    group_times_from_dict(path, data.get("dp_collectives")),
                    in_layer_times(path, data.get("collectives")),
                    _layer(path, "tied", data["tied"]) if "tied" in data else LayerCost())


def _mtp_entries(path: str, raw: Any) -> tuple[LayerCost, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or not raw or len(raw) > limits.MAX_LAYERS:
        raise UserError(f"{path}: mtp", f"must be a list of 1 to {limits.MAX_LAYERS:,} layer "
                        "costs, or absent", "one entry per MTP layer, or one for every one")
    return tuple(_layer(path, f"mtp[{i}]", x) for i, x in enumerate(raw))


_CACHE: dict[str, tuple[tuple[int, int], CostFile]] = {}


def read_cost_file(path: str) -> CostFile:
    """Read and check a cost file (cached by modification time: the planner asks often)."""
    full = os.path.abspath(path)
    # Refused up front: a device (/dev/zero), a FIFO or a runaway file is never read.
    files.readable_file("--costs", full, files.MAX_COSTS_BYTES, "cost file")
    try:
        st = os.stat(full)
    except OSError as exc:
        raise UserError("--costs", f"cannot read {path}: {exc.strerror}",
                        "pass a cost file written by ppsim profile or ppsim calibrate") from None
    stamp = (st.st_mtime_ns, st.st_size)
    hit = _CACHE.get(full)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    data = files.read_json("--costs", full, files.MAX_COSTS_BYTES, "cost file",
                              "re-run ppsim profile or ppsim calibrate",
                              max_containers=MAX_CONTAINERS)
    cf = cost_file_from_dict(data, path)
    _CACHE[full] = (stamp, cf)
    return cf


def check_model(cf: CostFile, model_fields: dict[str, Any]) -> None:
    """Refuse a file measured for another layer shape (its numbers would silently mislead);
    `model_fields`: a transformer's fields (ppsim.config.model.TransformerModel.fields)."""
    if cf.model is None or cf.model.get("kind", "transformer") != "transformer":
        return

    defaults = {f.name: f.default for f in fields(Architecture)}
    for key in SHAPE_KEYS:
        want = model_fields.get(key, defaults.get(key))
        have = cf.model.get(key, defaults.get(key))
        if key == "hybrid_layer_pattern":  # the layers matter, not where `|` splits them
            want, have = pattern_layers(want), pattern_layers(have)
        if key == "layers":  # "dense*3, moe*58" as typed, spaces aside
            want, have = str(want or "").replace(" ", ""), str(have or "").replace(" ", "")
        if key == "sequence_parallel" and cf.model.get("tp", 1) == 1:
            continue  # Megatron turns it off at tp 1: nothing differs
        if key in ("norm", "position", "max_position_embeddings"):
            want, have = (_meant(m, key, defaults) for m in (model_fields, cf.model))
        if key == "cp_comm_type" and cf.model.get("cp", 1) == 1:
            continue  # no context-parallel traffic at cp 1
        if key == "cp_a2a_size" and (cf.model.get("cp", 1) == 1
                                     or cf.model.get("cp_comm_type") != "a2a+p2p"):
            continue  # only the hierarchical form has groups of this size
        if want != have:
            raise UserError(f"{cf.path}: model.{key}", f"the file was measured with {key} = "
                            f"{have!r} but the config has {want!r}",
                            "re-run ppsim profile for this model, or drop --costs")


def _meant(model: dict[str, Any], key: str, defaults: dict[str, Any]) -> Any:
    """A field with two spellings by what it means: an empty norm or position is the MLP's
    (Architecture.rmsnorm, .rotary); a position table's rows, 0 the sequence, only where
    positions are learned (rotary ones keep no table)."""
    def get(k: str) -> Any:
        return model.get(k, defaults.get(k))

    gated = get("gated_mlp")
    if key == "norm":
        return get("norm") or ("rmsnorm" if gated else "layernorm")
    position = get("position") or ("rotary" if gated else "learned")
    if key == "position":
        return position
    return (get("max_position_embeddings") or get("seq_length")) if position == "learned" else 0


def load_costs(path: str, num_layers: int | None = None,
               model_fields: dict[str, Any] | None = None, mtp_layers: int = 0) -> ModelCosts:
    """The ModelCosts of a cost file, sized to num_layers (and mtp_layers MTP layers) and
    checked against the model (a transformer's fields; None: nothing to check)."""
    cf = read_cost_file(path)
    if model_fields is not None:
        check_model(cf, model_fields)
        if not model_fields.get("tie_embeddings"):  # the config's model keeps two tables
            cf = replace(cf, tied=LayerCost())
        elif cf.model is not None and not cf.tied.params:
            raise UserError(f"{path}: tied", "the file holds no tied table (it was measured "
                            "for an untied model), so a rank holding both ends of the tied "
                            "model would count two tables", "re-run ppsim profile for the tied "
                            "model, or drop --costs")
    return cf.model_costs(num_layers, mtp_layers)


def load_conditions(path: str) -> Conditions | None:
    """The run conditions the file was measured under, if it says."""
    return read_cost_file(path).conditions


def load_p2p(path: str) -> tuple[float | None, float | None]:
    """(latency ms, bandwidth GB/s) measured in the file; None where it has none."""
    cf = read_cost_file(path)
    return cf.p2p_latency_ms, cf.p2p_bandwidth_gbps


def load_timed_groups(path: str) -> tuple[TimedGroup, ...]:
    """The groups whose collectives the file timed."""
    return read_cost_file(path).timed_groups
