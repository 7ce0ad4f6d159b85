"""The state the TUI edits, how an edit becomes a Config, and one evaluation.

`EditState` is immutable (so undo/redo is a stack of values); `apply_setting`
validates a settings change completely (by building the problem) before it
returns a new state, so a refused change leaves everything as it was.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ppsim.config import Config, model_fields
from ppsim.errors import UserError
from ppsim.presets import HARDWARE_PRESETS, MODEL_PRESETS
from ppsim.problem import Problem, build_problem, resolve_split
from ppsim.schedules import SCHEDULES, schedule_placement
from ppsim.simulator import Simulation, simulate
from ppsim.split import Split
from tui.editing import EditRefused, balanced_counts, check_shape, parse_float, parse_int

RECOMPUTE_MODES = ("none", "selective", "full")
SETTINGS = ("schedule", "pp", "vpp", "microbatches", "recompute", "memory_gb", "model",
            "hardware")


@dataclass(frozen=True)
class EditState:
    """Everything the TUI lets a user change; the rest stays in the base Config."""

    model_preset: str | None
    recompute: str
    schedule: str
    pp: int
    vpp: int
    microbatches: int
    counts: tuple[int, ...]
    memory_bytes: float
    hardware_preset: str | None

    @property
    def split(self) -> Split:
        return Split(self.counts, self.pp, self.vpp,
                     schedule_placement(self.schedule))  # type: ignore[arg-type]

    @property
    def num_layers(self) -> int:
        return sum(self.counts)


def state_from_config(cfg: Config) -> EditState:
    """The editable view of a config (its split resolved to per-stage counts)."""
    fields = model_fields(cfg.model)
    p = cfg.pipeline
    split = resolve_split(cfg, None, schedule_placement(p.schedule))
    return EditState(model_preset=cfg.model.get("preset"),
                     recompute=str(fields.get("recompute", "none")), schedule=p.schedule,
                     pp=p.pp, vpp=p.vpp, microbatches=p.microbatches, counts=split.counts,
                     memory_bytes=cfg.hardware.memory_bytes,
                     hardware_preset=cfg.hardware.preset)


def config_for(base: Config, state: EditState) -> Config:
    """A new Config: `base` with the state's choices written in (split as a list)."""
    model = copy.deepcopy(base.model)
    if state.model_preset is not None and state.model_preset != base.model.get("preset"):
        model = {"preset": state.model_preset}
    if model_fields(model).get("kind", "uniform") == "transformer":
        if state.recompute != "none" or "recompute" in model:
            model["recompute"] = state.recompute
    pipe = replace(base.pipeline, pp=state.pp, vpp=state.vpp, microbatches=state.microbatches,
                   schedule=state.schedule, split=list(state.counts), layout=None,
                   first_stage_layers=None, last_stage_layers=None,
                   account_for_embedding=False, account_for_loss=False)
    hw = replace(base.hardware)
    if state.hardware_preset != base.hardware.preset and state.hardware_preset is not None:
        for key, value in HARDWARE_PRESETS[state.hardware_preset].items():
            setattr(hw, key, value)
        hw.preset = state.hardware_preset
    hw.memory_bytes = state.memory_bytes
    return Config(model=model, pipeline=pipe, hardware=hw, costs_file=base.costs_file)


def schedule_vpp(schedule: str, pp: int, vpp: int, microbatches: int) -> int:
    """The vpp to use with a newly chosen schedule: the current one if the schedule
    takes it, else 2 or 1 (interleaved and V schedules need 2 chunks, 1F1B one)."""
    from ppsim.schedules import build_schedule

    for cand in (vpp, 2, 1):
        try:
            build_schedule(schedule, pp, cand, microbatches)
        except UserError:
            continue
        return cand
    return vpp


def check_state(base: Config, state: EditState, field: str) -> Problem:
    """Build the problem for a state; any UserError becomes EditRefused on `field`."""
    try:
        check_shape(state.num_layers, state.pp, state.vpp)
        return build_problem(config_for(base, state))
    except UserError as exc:
        raise EditRefused(field, str(exc)) from None


def apply_setting(base: Config, state: EditState, name: str, text: str) -> EditState:
    """The state after setting `name` to the typed/selected `text`, fully checked."""
    s = state
    if name == "pp":
        pp = parse_int("pp", text, 1)
        s = replace(s, pp=pp, counts=balanced_counts(s.num_layers, pp * s.vpp))
    elif name == "vpp":
        vpp = parse_int("vpp", text, 1)
        sched = s.schedule
        if vpp > 1 and sched == "1f1b":
            sched = "interleaved-1f1b"
        elif vpp == 1 and sched == "interleaved-1f1b":
            sched = "1f1b"
        check_shape(s.num_layers, s.pp, vpp)
        s = replace(s, vpp=vpp, schedule=sched,
                    counts=balanced_counts(s.num_layers, s.pp * vpp))
    elif name == "microbatches":
        s = replace(s, microbatches=parse_int("microbatches", text, 1))
    elif name == "schedule":
        if text not in SCHEDULES:
            raise EditRefused("schedule", f"unknown schedule {text!r}")
        vpp = schedule_vpp(text, s.pp, s.vpp, s.microbatches)
        counts = s.counts if vpp == s.vpp else balanced_counts(s.num_layers, s.pp * vpp)
        s = replace(s, schedule=text, vpp=vpp, counts=counts)
    elif name == "recompute":
        if text not in RECOMPUTE_MODES:
            raise EditRefused("recompute", f"unknown mode {text!r}")
        s = replace(s, recompute=text)
    elif name == "memory_gb":
        s = replace(s, memory_bytes=parse_float("memory_gb", text) * 1e9)
    elif name == "model":
        if text not in MODEL_PRESETS:
            raise EditRefused("model", f"unknown preset {text!r}")
        layers = int(MODEL_PRESETS[text]["num_layers"])
        s = replace(s, model_preset=text, counts=balanced_counts(layers, s.pp * s.vpp))
    elif name == "hardware":
        if text not in HARDWARE_PRESETS:
            raise EditRefused("hardware", f"unknown preset {text!r}")
        s = replace(s, hardware_preset=text,
                    memory_bytes=float(HARDWARE_PRESETS[text]["memory_bytes"]))
    else:
        raise EditRefused(name, "not a setting")
    check_state(base, s, name)
    return s


# ------------------------------------------------------------------ evaluation


@dataclass(frozen=True)
class Result:
    """One simulated iteration of a state, with the even-split baseline."""

    state: EditState
    config: Config
    sim: Simulation
    baseline_ms: float | None
    """Iteration time of Megatron's even split (None when layers don't divide)."""
    baseline_counts: tuple[int, ...] | None

    @property
    def speedup(self) -> float | None:
        t = self.sim.summary.iteration_time_ms
        return self.baseline_ms / t if self.baseline_ms and t > 0 else None


_baseline_cache: dict[Any, tuple[float | None, tuple[int, ...] | None]] = {}


def baseline(problem: Problem, key: Any) -> tuple[float | None, tuple[int, ...] | None]:
    """Iteration time of Megatron's even split for this problem (cached per key)."""
    if key in _baseline_cache:
        return _baseline_cache[key]
    from ppsim.evaluate import evaluate
    from ppsim.split import even_split
    from ppsim.timing import compile_schedule, op_table

    try:
        even = even_split(problem.split.num_layers, problem.split.pp, problem.split.vpp)
    except UserError:
        out: tuple[float | None, tuple[int, ...] | None] = (None, None)
    else:
        even = replace(even, placement=problem.split.placement)
        p = problem.with_split(even)
        table = op_table(compile_schedule(p.schedule), p.stage_costs, p.hardware.transfer_ms)
        layers = [even.rank_layers(r) for r in range(even.pp)]
        summary = evaluate(table, layers, p.hardware.memory_bytes)
        out = (summary.iteration_time_ms, even.counts)
    if len(_baseline_cache) > 64:
        _baseline_cache.clear()
    _baseline_cache[key] = out
    return out


def _base_key(base: Config) -> str:
    from ppsim.config import config_to_toml

    return config_to_toml(base)


def evaluate_state(base: Config, state: EditState) -> Result:
    """Simulate the state with the reference simulator (the numbers `ppsim simulate` gives)."""
    cfg = config_for(base, state)
    problem = build_problem(cfg)
    sim = simulate(problem)
    key = (_base_key(base), replace(state, counts=()))
    base_ms, base_counts = baseline(problem, key)
    return Result(state, cfg, sim, base_ms, base_counts)


# ------------------------------------------------------------------ planner

Progress = Callable[[int, int], None]


def planner_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("ppsim.planner") is not None


def run_planner(base: Config, state: EditState, progress: Progress | None = None) -> Any:
    """ppsim.planner.plan on the current state's problem (imported lazily)."""
    from ppsim import planner  # type: ignore[attr-defined]

    problem = build_problem(config_for(base, state))
    return planner.plan(problem, top_k=5, progress=progress)


def state_with_split(state: EditState, split: Split) -> EditState:
    """The state with a planner's split (its pp/vpp may differ)."""
    sched = state.schedule
    if split.vpp > 1 and sched == "1f1b":
        sched = "interleaved-1f1b"
    elif split.vpp == 1 and sched == "interleaved-1f1b":
        sched = "1f1b"
    return replace(state, counts=tuple(split.counts), pp=split.pp, vpp=split.vpp, schedule=sched)
