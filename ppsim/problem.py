"""Turn a Config into what the simulator needs: costs, split, schedule, limits."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ppsim import split as splits
from ppsim.config import LAYER_FIELDS, Config, model_fields
from ppsim.costs import LayerCost, ModelCosts, StageCost, stage_costs, uniform_costs
from ppsim.errors import UserError
from ppsim.schedules import Schedule, build_schedule
from ppsim.split import Split
from ppsim.transformer import Accelerator, Architecture, transformer_costs


@dataclass(frozen=True)
class Hardware:
    memory_bytes: float
    p2p_latency_ms: float = 0.0
    p2p_bandwidth_gbps: float = 0.0

    def transfer_ms(self, nbytes: int) -> float:
        """Time from send to arrival of one message; 0 when transfers are free."""
        t = self.p2p_latency_ms
        if self.p2p_bandwidth_gbps > 0:
            t += nbytes / (self.p2p_bandwidth_gbps * 1e6)  # GB/s -> bytes per ms
        return t


@dataclass(frozen=True)
class Problem:
    """A fully resolved pipeline: what `simulate` runs."""

    costs: ModelCosts
    split: Split
    schedule: Schedule
    hardware: Hardware

    @property
    def stage_costs(self) -> list[StageCost]:
        return stage_costs(self.costs, self.split)

    def with_split(self, split: Split) -> Problem:
        return replace(self, split=split)


def _layer(table: dict[str, Any], where: str) -> LayerCost:
    kw: dict[str, Any] = {}
    for key, value in table.items():
        if key not in LAYER_FIELDS:
            raise UserError(f"{where}.{key}", "unknown key", "valid keys: " + ", ".join(
                LAYER_FIELDS))
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise UserError(f"{where}.{key}", f"must be a number >= 0, got {value!r}",
                            "write a non-negative number")
        kw[key] = int(value) if key.endswith("bytes") else float(value)
    return LayerCost(**kw)


def model_costs(cfg: Config) -> ModelCosts:
    """Costs of the configured model: measured cost file, uniform, or transformer."""
    if cfg.costs_file:
        from ppsim.costfile import load_costs

        fields = model_fields(cfg.model)
        return load_costs(cfg.costs_file, int(fields["num_layers"]), fields)
    raw = model_fields(cfg.model)
    if raw.get("kind", "uniform") == "uniform":
        layer = {k: v for k, v in raw.items() if k in LAYER_FIELDS}
        lc = _layer(layer, "model")
        if lc.weight_grad_ms > lc.backward_ms:
            raise UserError("model.weight_grad_ms", "exceeds backward_ms",
                            "weight_grad_ms is the part of backward_ms spent on weights")
        emb = _layer(raw["embedding"], "model.embedding") if "embedding" in raw else None
        head = _layer(raw["head"], "model.head") if "head" in raw else None
        return uniform_costs(raw["num_layers"], lc, emb, head)
    arch = Architecture(**{k: v for k, v in raw.items() if k != "kind"})
    if arch.hidden_size % arch.num_heads or arch.num_heads % arch.num_kv_heads:
        raise UserError("model.num_heads", "hidden_size must divide by num_heads and num_heads "
                        "by num_kv_heads", "fix the head counts")
    acc = Accelerator(peak_tflops=cfg.hardware.peak_tflops, efficiency=cfg.hardware.efficiency)
    return transformer_costs(arch, acc)


def resolve_split(cfg: Config, num_layers: int, placement: str = "loop") -> Split:
    """The split the pipeline section asks for (list, layout, Megatron counts, or even)."""
    p = cfg.pipeline
    chosen = [name for name, val in (("split", p.split), ("layout", p.layout),
                                     ("first/last_stage_layers",
                                      p.first_stage_layers or p.last_stage_layers),
                                     ("account_for_embedding/loss",
                                      p.account_for_embedding or p.account_for_loss)) if val]
    if "layout" in chosen and len(chosen) > 1:
        raise UserError("pipeline.layout", "cannot be combined with " + ", ".join(
            c for c in chosen if c != "layout"), "use the layout alone (Megatron rejects this)")
    if "split" in chosen and len(chosen) > 1:
        raise UserError("pipeline.split", "cannot be combined with " + ", ".join(
            c for c in chosen if c != "split"), "give one way of splitting")
    if p.split is not None:
        return splits.split_from_counts(p.split, p.pp, p.vpp, num_layers, placement)
    if p.layout is not None:
        s = splits.parse_layout(p.layout, p.pp, num_layers)
        if s.vpp != p.vpp:
            raise UserError("pipeline.vpp", f"is {p.vpp} but the layout has {s.num_stages} "
                            f"stages = {s.vpp} per rank", f"set vpp = {s.vpp}")
        return replace(s, placement=placement) if placement != s.placement else s
    s = splits.megatron_split(num_layers, p.pp, p.vpp, p.first_stage_layers,
                              p.last_stage_layers, p.account_for_embedding, p.account_for_loss)
    return replace(s, placement=placement) if placement != s.placement else s


def build_problem(cfg: Config, costs: ModelCosts | None = None) -> Problem:
    p = cfg.pipeline
    if p.actions_csv:
        from ppsim.torchcsv import load_actions_csv

        schedule = load_actions_csv(p.actions_csv, p.pp, p.vpp, p.microbatches)
    else:
        schedule = build_schedule(p.schedule, p.pp, p.vpp, p.microbatches)
    costs = costs or model_costs(cfg)
    split = resolve_split(cfg, costs.num_layers, schedule.placement)
    return Problem(costs, split, schedule, hardware(cfg))


def hardware(cfg: Config) -> Hardware:
    """Memory limit and P2P model; P2P measured in the cost file beats the preset."""
    latency, bandwidth = cfg.hardware.p2p_latency_ms, cfg.hardware.p2p_bandwidth_gbps
    if cfg.costs_file:
        from ppsim.costfile import load_p2p

        lat, bw = load_p2p(cfg.costs_file)
        latency = latency if lat is None else lat
        bandwidth = bandwidth if bw is None else bw
    hw = Hardware(cfg.hardware.memory_bytes, latency, bandwidth)
    if hw.memory_bytes <= 0:
        raise UserError("hardware.memory_bytes", f"must be positive, got {hw.memory_bytes:g}",
                        "give the memory one rank may use, e.g. 80e9 (--memory-gb 80)")
    if hw.p2p_latency_ms < 0:
        raise UserError("hardware.p2p_latency_ms", "must be >= 0", "use 0 for no latency")
    if hw.p2p_bandwidth_gbps < 0:
        raise UserError("hardware.p2p_bandwidth_gbps", "must be >= 0", "use 0 for free transfers")
    return hw
