"""The state the TUI edits, how an edit becomes a Config, and one evaluation.

`EditState` is immutable (so undo/redo is a stack of values). `apply_setting`
does the cheap checks (parsing, the shared size limits of ppsim.limits) at
once; building the problem is the full check and runs with the simulation,
off the UI thread, so no key press waits on it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ppsim.config import limits
from ppsim.config.model import Model, parse_model
from ppsim.config.overrides import with_overrides
from ppsim.config.presets import HARDWARE_PRESETS, MODEL_PRESETS
from ppsim.config.schema import Config
from ppsim.config.to_toml import config_to_toml
from ppsim.costs.choices import RECOMPUTE
from ppsim.errors import UserError
from ppsim.job.shape import arch_of
from ppsim.pipeline.problem import Problem, build_problem, resolve_split
from ppsim.pipeline.split import Split, even_counts
from ppsim.plan import planner
from ppsim.plan.floor import memory_floors
from ppsim.policy.model import StagePolicy
from ppsim.policy.setup import stage_policies
from ppsim.schedules.generators import (
    SCHEDULES,
    schedule_for_vpp,
    schedule_name,
    schedule_placement,
)
from ppsim.sim.engine import Simulation
from ppsim.sim.simulate import simulate
from ppsim.tui.cautions import state_warnings
from ppsim.tui.editing import EditRefused, parse_float, parse_int
from ppsim.tui.policy_edit import memory_tables
from ppsim.tui.replicas import Replicas, replicas_for_pp

RECOMPUTE_MODES = RECOMPUTE
SETTINGS = ("schedule", "pp", "vpp", "microbatches", "recompute", "memory_gb", "model",
            "hardware")
FROM_CONFIG = "config"
"""The model/hardware choice that means "as the config file has it" (no preset)."""
NO_RECOMPUTE = "n/a"
"""What the recompute field holds for a model without the setting (uniform costs)."""


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
    mtp: int = 0
    """MTP layers among the counts (they follow the decoder layers)."""
    policies: tuple[StagePolicy, ...] = ()
    """Each virtual stage's memory policy (ppsim.tui.policy_edit); () or a count that
    is not the stages': every stage on the recompute mode."""
    dp: int = 1
    """Data-parallel replicas (the model's dp): a pp edit keeps the GPUs where the job
    has a global batch (ppsim.tui.replicas)."""

    @property
    def split(self) -> Split:
        return Split(self.counts, self.pp, self.vpp, schedule_placement(self.schedule),
                     self.mtp)  # type: ignore[arg-type]

    @property
    def num_layers(self) -> int:
        return sum(self.counts)


def check_limits(num_layers: int, pp: int, vpp: int, microbatches: int, schedule: str,
                 field: str) -> None:
    """The shared size limits (ppsim.limits, the CLI's too), before anything is built:
    a state beyond them would freeze the screen, so it is refused as an edit."""
    spec = SCHEDULES.get(schedule)
    try:
        limits.check_shape(num_layers, pp, vpp, microbatches)
        limits.check_ops(pp, vpp, microbatches, bool(spec and spec.split_backward),
                         limits.INTERACTIVE)
    except UserError as exc:  # the field is named by the screen's label already
        raise EditRefused(field, exc.problem + (f" ({exc.fix})" if exc.fix else "")) from None


def check_chunks(schedule: str, pp: int, vpp: int, microbatches: int) -> None:
    """The schedule's rule on chunks per rank (a V runs exactly 2, zb-h1 one), before a
    split of that shape is built on the screen's thread: refused as an edit of vpp."""
    try:
        SCHEDULES[schedule].check(pp, vpp, microbatches)
    except UserError as exc:
        if exc.field in ("pipeline.vpp", "pipeline.schedule"):
            raise EditRefused("vpp", exc.problem + (f" ({exc.fix})" if exc.fix else "")) \
                from None


def _recompute(model: Model) -> str:
    return NO_RECOMPUTE if model.recompute is None else model.recompute


def _dp(model: Model) -> int:
    a = arch_of(model)
    return 1 if a is None else a.dp


def state_from_config(cfg: Config) -> EditState:
    """The editable view of a config (its split resolved to per-stage counts).

    Limits are checked before any per-layer or per-stage list is built."""
    p = cfg.pipeline
    num_layers = cfg.model.total_layers
    spec = SCHEDULES.get(p.schedule)
    limits.check_shape(num_layers, p.pp, p.vpp, p.microbatches)
    limits.check_ops(p.pp, p.vpp, p.microbatches, bool(spec and spec.split_backward),
                     limits.INTERACTIVE)
    mem = cfg.hardware.memory_bytes
    if not (math.isfinite(mem) and mem > 0):
        raise UserError("hardware.memory_bytes", f"must be a positive finite number, got {mem}",
                        "give the memory one rank may use, e.g. --memory-gb 80")
    # no split given: the core's default (Megatron's even split, else near-even)
    split = resolve_split(cfg, None, schedule_placement(p.schedule))
    policies = stage_policies(cfg, split) if cfg.memory is not None else ()
    return EditState(model_preset=cfg.model.preset, recompute=_recompute(cfg.model),
                     schedule=p.schedule, pp=p.pp, vpp=p.vpp, microbatches=p.microbatches,
                     counts=tuple(split.counts), memory_bytes=mem,
                     hardware_preset=cfg.hardware.preset, mtp=cfg.model.mtp_layers,
                     policies=policies, dp=_dp(cfg.model))


def config_for(base: Config, state: EditState) -> Config:
    """A new Config: `base` with the state's choices written in (split as a list), by
    the overrides the command line's flags use, so [placement], the cost file and
    the rest of the file stay as loaded."""
    preset = state.model_preset if state.model_preset not in (None, base.model.preset) \
        else None
    model: dict[str, Any] = {}
    if state.recompute in RECOMPUTE_MODES:  # set only for a transformer (see _recompute)
        model["recompute"] = state.recompute  # always: the preset's default may differ
        model["dp"] = state.dp
    hardware = state.hardware_preset \
        if state.hardware_preset not in (None, base.hardware.preset) else None
    per_stage = len(state.policies) == state.pp * state.vpp
    return with_overrides(base, preset=preset, model=model,
                          memory=memory_tables(state.policies) if per_stage else None,
                          pipeline={"pp": state.pp, "vpp": state.vpp,
                                    "microbatches": state.microbatches,
                                    "schedule": state.schedule},
                          split={"split": list(state.counts)}, hardware=hardware,
                          memory_bytes=state.memory_bytes)


def schedule_vpp(schedule: str, pp: int, vpp: int, microbatches: int) -> int:
    """The vpp to use with a newly chosen schedule: the current one if the schedule
    takes it, else 2 or 1 (interleaved and V schedules need 2 chunks, 1F1B one).
    Only the schedule's own checks run (no schedule is generated on the UI thread)."""
    for cand in (vpp, 2, 1):
        try:
            SCHEDULES[schedule].check(pp, cand, microbatches)
        except UserError as exc:
            if exc.field in ("pipeline.vpp", "pipeline.schedule"):
                continue  # another problem (microbatches) is the worker's to report
        return cand
    return vpp


def check_state(base: Config, state: EditState, field: str) -> Problem:
    """Build the problem for a state (the full check; runs in the simulation worker);
    any UserError becomes EditRefused on `field`."""
    try:
        check_limits(state.num_layers, state.pp, state.vpp, state.microbatches,
                     state.schedule, field)
        return build_problem(config_for(base, state))
    except UserError as exc:
        raise EditRefused(field, str(exc)) from None


def _shape(state: EditState, field: str, **changes: Any) -> EditState:
    """`state` with new pp/vpp/microbatches/schedule/model, limits checked before the
    counts are rebuilt (an even split of the new shape when the shape changed)."""
    s = replace(state, **changes)
    layers = state.num_layers
    check_limits(layers, s.pp, s.vpp, s.microbatches, s.schedule, field)
    if (s.pp, s.vpp, layers) != (state.pp, state.vpp, state.num_layers):
        s = replace(s, counts=even_counts(layers, s.pp, s.vpp, s.mtp), policies=())
    return s


def apply_setting(base: Config, state: EditState, name: str, text: str) -> EditState:
    """The state after setting `name` to the typed/selected `text`.

    Only cheap checks run here (parsing, the shared size limits), so a key press
    never waits; the full check (building the problem) runs with the simulation,
    and a state it refuses is reverted there."""
    s = state
    if name == "pp":
        pp = parse_int("pp", text, 1)
        r = replicas_for_pp(base, s.model_preset, s.pp, Replicas(s.dp, s.microbatches), pp)
        return _shape(s, name, pp=pp, dp=r.dp, microbatches=r.microbatches)
    if name == "vpp":
        vpp = parse_int("vpp", text, 1)
        schedule = schedule_for_vpp(s.schedule, vpp)
        check_chunks(schedule, s.pp, vpp, s.microbatches)
        return _shape(s, name, vpp=vpp, schedule=schedule)
    if name == "microbatches":
        return _shape(s, name, microbatches=parse_int("microbatches", text, 1))
    if name == "schedule":
        text = schedule_name(text)
        if text not in SCHEDULES:
            raise EditRefused("schedule", f"unknown schedule {text!r}")
        check_limits(s.num_layers, s.pp, s.vpp, s.microbatches, text, name)
        return _shape(s, name, schedule=text, vpp=schedule_vpp(text, s.pp, s.vpp,
                                                               s.microbatches))
    if name == "recompute":
        if s.recompute == NO_RECOMPUTE:
            raise EditRefused("recompute", "this model has no recompute setting (uniform "
                              "costs); choose a transformer model")
        if text not in RECOMPUTE_MODES:
            raise EditRefused("recompute", f"unknown mode {text!r}")
        return replace(s, recompute=text, policies=())  # the mode sets every stage
    if name == "memory_gb":
        return replace(s, memory_bytes=parse_float("memory_gb", text) * 1e9)
    if name == "model":
        return _model(base, s, text)
    if name == "hardware":
        if text == FROM_CONFIG:
            return replace(s, hardware_preset=None, memory_bytes=base.hardware.memory_bytes)
        if text not in HARDWARE_PRESETS:
            raise EditRefused("hardware", f"unknown preset {text!r}")
        return replace(s, hardware_preset=text,
                       memory_bytes=float(HARDWARE_PRESETS[text]["memory_bytes"]))
    raise EditRefused(name, "not a setting")


def _model(base: Config, s: EditState, text: str) -> EditState:
    """A new model: its layers split evenly, its own recompute default shown and used."""
    if text in (FROM_CONFIG, base.model.preset):
        model, preset = base.model, base.model.preset
    elif text in MODEL_PRESETS:
        model, preset = parse_model({"preset": text}), text
    else:
        raise EditRefused("model", f"unknown preset {text!r}")
    layers = model.total_layers
    s = replace(s, model_preset=preset, recompute=_recompute(model), mtp=model.mtp_layers,
                dp=_dp(model))
    check_limits(layers, s.pp, s.vpp, s.microbatches, s.schedule, "model")
    return replace(s, counts=even_counts(layers, s.pp, s.vpp, s.mtp), policies=())


# ------------------------------------------------------------------ evaluation


@dataclass(frozen=True)
class Result:
    """One simulated iteration of a state, and of the pinned split it is compared with."""

    state: EditState
    config: Config
    sim: Simulation
    pinned: Simulation
    """The pinned split's simulation: the even split unless the user pinned another."""
    pinned_is_even: bool
    no_split_fits: bool = False
    """No split of this shape fits memory (the planner's floor, ppsim.plan.floor.memory_floors)."""
    warnings: tuple[str, ...] = ()
    """What the CLI prints on stderr for this state (ppsim.tui.cautions.state_warnings)."""

    @property
    def pinned_counts(self) -> tuple[int, ...]:
        return tuple(self.pinned.problem.split.counts)

    @property
    def baseline_ms(self) -> float:
        return self.pinned.summary.iteration_time_ms

    @property
    def speedup(self) -> float | None:
        """Pinned time over current time: above 1 the current split is faster."""
        t = self.sim.summary.iteration_time_ms
        return self.baseline_ms / t if t > 0 else None


def pinned_counts(state: EditState, pinned: tuple[int, ...] | None) -> tuple[int, ...]:
    """The pinned split if it fits the state's shape, else the state's even split."""
    if pinned is not None and len(pinned) == state.pp * state.vpp and \
            sum(pinned) == state.num_layers:
        return pinned
    return even_counts(state.num_layers, state.pp, state.vpp, state.mtp)


_pinned_cache: dict[Any, Simulation] = {}


def _base_key(base: Config) -> str:
    return config_to_toml(base)


def evaluate_state(base: Config, state: EditState,
                   pinned: tuple[int, ...] | None = None) -> Result:
    """Simulate the state and its pinned split with the reference simulator (the
    numbers `ppsim simulate` gives). UserError when the core refuses the state."""
    cfg = config_for(base, state)
    problem = build_problem(cfg)
    sim = simulate(problem)
    counts = pinned_counts(state, pinned)
    key = (_base_key(base), replace(state, counts=counts))
    other = sim if counts == state.counts else _pinned_cache.get(key)
    if other is None:
        other = simulate(problem.with_split(replace(problem.split, counts=counts)))
    if len(_pinned_cache) > 32:
        _pinned_cache.clear()
    _pinned_cache[key] = other  # the next edits of this shape compare with it for free
    even = counts == even_counts(state.num_layers, state.pp, state.vpp, state.mtp)
    return Result(state, cfg, sim, other, even,
                  not sim.summary.fits and _no_split_fits(base, state, problem),
                  state_warnings(cfg, problem))


_floor_cache: dict[Any, bool] = {}


def _no_split_fits(base: Config, state: EditState, problem: Problem) -> bool:
    """Whether no split of the state's shape fits (split-independent: cached per shape)."""
    key = (_base_key(base), replace(state, counts=pinned_counts(state, None)))
    hit = _floor_cache.get(key)
    if hit is None:
        if len(_floor_cache) > 32:
            _floor_cache.clear()
        floor = memory_floors(problem).floor
        hit = _floor_cache[key] = floor.peak_bytes > problem.hardware.memory_bytes
    return hit


# ------------------------------------------------------------------ planner

Progress = Callable[[int, int], None]


def planner_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("ppsim.plan.planner") is not None


def run_planner(base: Config, state: EditState, progress: Progress | None = None) -> Any:
    """ppsim.planner.plan on the current state's problem (imported lazily)."""

    problem = build_problem(config_for(base, state))
    return planner.plan(problem, top_k=5, progress=progress)


def plan_in_child(base: Config, state: EditState, conn: Any) -> None:
    """The planner in a child process (so it never competes with the screen for the
    GIL, and cancelling it stops it): progress, then ("done", result) or ("error", text)
    on the pipe, at most 20 progress messages a second."""
    import time

    last = [0.0]

    def progress(done: int, total: int) -> None:
        now = time.monotonic()
        if now - last[0] >= 0.05 or (total and done >= total):
            last[0] = now
            conn.send(("progress", done, total))

    try:
        conn.send(("done", run_planner(base, state, progress)))
    except UserError as exc:
        conn.send(("error", str(exc)))


def state_with_split(state: EditState, split: Split) -> EditState:
    """The state with a planner's split (its pp/vpp may differ)."""
    return replace(state, counts=tuple(split.counts), pp=split.pp, vpp=split.vpp,
                   schedule=schedule_for_vpp(state.schedule, split.vpp))
