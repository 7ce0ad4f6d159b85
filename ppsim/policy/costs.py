"""A virtual stage's costs under a memory policy, from the per-module op lists.

Layers a stage recomputes whole (its first N) cost what the "full" mode costs;
the others cost their recompute modules' variant (ppsim.costs.modules: the
tensors they drop, the forward ops they repeat inside B). Offload moves
`offload_fraction` of the offload modules' tensors to host memory over the host
link, on the device's copy streams (simulated by ppsim.sim.copies: out after the F,
back before the B, the B stalls when the copy is late). The planner prices the same
copies per stage (ppsim.sim.copies.estimated) and re-simulates what it reports.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from ppsim.costs.arch import Architecture
from ppsim.costs.kinds import kind_effect, piece_kinds
from ppsim.costs.model import (
    ModelCosts,
    StageCost,
    ends_transient,
    held_input_bytes,
    sum_parts,
)
from ppsim.costs.modules import OFFLOAD_MODULES, offloaded_input_bytes
from ppsim.costs.transformer import Accelerator, layer_kinds, transformer_costs
from ppsim.policy.delta import Group, delta_held_bytes
from ppsim.policy.model import ALL_LAYERS, StagePolicy
from ppsim.sim.copies import estimated


@dataclass(frozen=True, kw_only=True)
class _Offload:
    """Prefix sums over the layers (index i: layers 0..i-1) at offload fraction 1."""

    moved: tuple[int, ...]
    """Bytes the offload modules copy to the host and back (the host link's load)."""
    freed: tuple[int, ...]
    """Of those, the bytes that leave the device."""


@dataclass(kw_only=True)
class PolicyCosts:
    """Per-layer costs of one model under any policy, computed once per module set."""

    arch: Architecture
    """The model (its global recompute mode is ignored: the policy says)."""
    acc: Accelerator
    """The device the ops run on."""
    price: Callable[[tuple[str, ...], bool], ModelCosts] | None = None
    """A variant's layers given (recomputed modules, whole-layer recompute): the job's,
    with its collectives (ppsim.job.layers.job_costs); None: transformer_costs of `arch`."""
    host_link_gbps: float = 0.0
    """Host link bandwidth each way (GB/s); 0: copies are free."""
    host_limit_bytes: float = float("inf")
    """Host memory one rank's offloaded tensors may use (its node's over its devices)."""
    combined: bool = False
    """Megatron's combined 1F1B runs (--overlap-moe-expert-parallel-comm): it refuses
    whole-layer recompute and the "moe" module, so no search offers them."""
    shared_overlap: bool = False
    """--moe-shared-expert-overlap: Megatron refuses the shared_experts recompute beside it."""
    _variants: dict[tuple[str, ...], ModelCosts] = field(default_factory=dict)
    _offload: dict[tuple[tuple[str, ...], tuple[str, ...]], _Offload] = field(
        default_factory=dict)
    _next_larger: list[int] | None = field(default=None, init=False, repr=False)
    _more: dict[tuple[tuple[str, ...], tuple[str, ...], float], list[int]] = field(
        default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self.full = self._priced((), True)
        self.base = self.layers_under(())
        self.kinds = layer_kinds(self.arch) + ("mtp",) * self.arch.mtp_layers
        self.first_mtp = len(self.kinds) - self.arch.mtp_layers

    def recomputed(self, policy: StagePolicy, offset: int, count: int) -> int:
        """Layers [offset, offset + count) recompute whole: the first N. Megatron's block
        method (N below all) skips the MTP layers, which follow the decoder's
        (multi_token_prediction.py: "not supported for MTP yet. Skipping recompute"); its
        uniform method (N all) recomputes them too."""
        if policy.recompute_layers >= ALL_LAYERS:
            return count
        decoder = max(0, min(offset + count, self.first_mtp) - offset)
        return min(policy.recompute_layers, decoder)

    def _priced(self, modules: tuple[str, ...], full: bool) -> ModelCosts:
        if self.price is not None:
            return self.price(modules, full)
        return transformer_costs(self.arch, self.acc, recompute=modules, full=full)

    def layers_under(self, modules: tuple[str, ...]) -> ModelCosts:
        """Every layer recomputing `modules` (no block recompute, no offload)."""
        hit = self._variants.get(modules)
        if hit is None:
            hit = self._variants[modules] = self._priced(modules, False)
        return hit

    def offloaded(self, modules: tuple[str, ...], offload: tuple[str, ...]) -> _Offload:
        """Prefix sums over the layers of the bytes the offload modules move at fraction 1,
        and of what of those leaves the device (ModuleEffect.freed_bytes)."""
        key = (modules, offload)
        hit = self._offload.get(key)
        if hit is None:
            effects = {k: self._moved_and_freed(k, modules, offload) for k in set(self.kinds)}
            moved, freed = [0], [0]
            for k in self.kinds:
                moved.append(moved[-1] + effects[k][0])
                freed.append(freed[-1] + effects[k][1])
            hit = self._offload[key] = _Offload(moved=tuple(moved), freed=tuple(freed))
        return hit

    def _moved_and_freed(self, kind: str, modules: tuple[str, ...],
                         offload: tuple[str, ...]) -> tuple[int, int]:
        """The bytes the offload modules move off a piece of `kind`, and of those what
        leaves the device: an MTP module's decoder layers' summed."""
        effects = [kind_effect(self.arch, k, modules, offload)
                   for k in piece_kinds(self.arch, kind)]
        return (sum(e.offloaded_bytes for e in effects), sum(e.freed_bytes for e in effects))

    def memory_rises(self, policy: StagePolicy, offset: int, count: int) -> list[int]:
        """The N in 1..count at which recomputing one more of the stage's layers whole may
        raise its memory under `policy`: 1; where that layer's transient is the largest of
        the first N (StageCost.transient_bytes); where it keeps more whole-recomputed than
        `policy` keeps of it (an offloaded layer may keep less than its input). Between two
        of them memory falls as N grows."""
        hi, more = offset + count, self._keeps_more(policy)
        rises = {i - offset + 1 for i in more[bisect_left(more, offset):bisect_left(more, hi)]}
        i, larger = offset, self._next_larger_transient()
        while i < hi:
            rises.add(i - offset + 1)
            i = larger[i]
        return sorted(rises)

    def _next_larger_transient(self) -> list[int]:
        """Per layer, the next layer whose whole-layer recompute transient is larger (the
        layer count if none), by a monotone stack."""
        if self._next_larger is None:
            values = [c.transient_bytes for c in self.full.layers]
            nxt, stack = [len(values)] * len(values), []
            for i, v in enumerate(values):
                while stack and values[stack[-1]] < v:
                    nxt[stack.pop()] = i
                stack.append(i)
            self._next_larger = nxt
        return self._next_larger

    def _keeps_more(self, policy: StagePolicy) -> list[int]:
        """The layers that keep more recomputed whole than under `policy`'s modules and
        offload (ascending)."""
        key = (policy.recompute_modules, policy.offload_modules, policy.offload_fraction)
        hit = self._more.get(key)
        if hit is None:
            var = self.layers_under(policy.recompute_modules).layers
            freed = (self.offloaded(policy.recompute_modules, policy.offload_modules).freed
                     if policy.offloads else None)
            hit = []
            for i, (whole, kept) in enumerate(zip(self.full.layers, var, strict=True)):
                out = policy.offload_fraction * (freed[i + 1] - freed[i]) if freed else 0
                if (whole.activation_bytes > kept.activation_bytes - out
                        or whole.weight_grad_bytes > kept.weight_grad_bytes):
                    hit.append(i)
            self._more[key] = hit
        return hit

    def copy_ms(self, nbytes: float) -> float:
        return nbytes / (self.host_link_gbps * 1e6) if self.host_link_gbps > 0 else 0.0

    def stage_cost(self, policy: StagePolicy, offset: int, count: int, first: bool, last: bool,
                   receives: bool) -> StageCost:
        """Layers [offset, offset + count) (and the embedding/head where they sit) under
        `policy`: its first N layers recomputed whole, the rest by module, summed in
        ppsim.costs.model.sum_parts's order (a policy that recomputes and offloads
        nothing prices a stage as the model without a policy does, to the last digit)."""
        n = self.recomputed(policy, offset, count)
        lo, mid, hi = offset, offset + n, offset + count
        s = sum_parts([*([self.base.embedding] if first else []), *self.full.layers[lo:mid],
                       *self.layers_under(policy.recompute_modules).layers[mid:hi],
                       *([self.base.head] if last else [])])
        twice = self.base.held_twice(first, last, self.base.holds_first_mtp(offset, count))
        act = s.activation_bytes + held_input_bytes(self.base, count, last, receives)
        off = copied = 0
        if policy.offloads:
            pre = self.offloaded(policy.recompute_modules, policy.offload_modules)
            copied = int(policy.offload_fraction * (pre.moved[hi] - pre.moved[mid]))
            off = int(policy.offload_fraction * (pre.freed[hi] - pre.freed[mid]))
            if receives and n == 0 and round(policy.offload_fraction * count) >= 1 \
                    and self.kinds[offset] != "mtp":  # its layers take its projection's
                # The runtime holds the stage's input until its B (held_input_bytes):
                # offloading the first layer's copy of it frees nothing on the device.
                off -= min(off, offloaded_input_bytes(
                    self.arch, self.kinds[offset], policy.recompute_modules,
                    policy.offload_modules))
        transient = max(self.full.transient_in(lo, n),
                        self.layers_under(policy.recompute_modules).transient_in(mid, hi - mid),
                        ends_transient(self.base, first, last))
        # The copies run on the device's copy streams (ppsim.sim.copies): the offloaded
        # tensors are part of the F's allocation until their copy out ends. What W needs
        # (matmul inputs) comes back with the reload before B and stays until W.
        return StageCost(s.forward_ms, s.backward_ms, s.weight_grad_ms,
                         s.static_bytes - twice.static_bytes, act, s.weight_grad_bytes,
                         0 if last else self.base.hidden_bytes, s.params - twice.params,
                         s.split_backward_ms, offload_bytes=off, copy_ms=self.copy_ms(copied),
                         expert_params=self.base.experts_in(offset, count),
                         pair_saving_ms=s.pair_saving_ms, transient_bytes=transient)

    def stalls(self, policy: StagePolicy, offset: int, count: int, first: bool,
               last: bool, receives: bool) -> bool:
        """The policy's copies take longer than the ops they hide behind."""
        return policy.offloads and copies_stall(
            self.stage_cost(policy, offset, count, first, last, receives))

    def groups(self, policy: StagePolicy, offset: int, count: int) -> list[Group]:
        """A microbatch's offload groups of the stage, in forward order: per layer not
        recomputed whole, per offloaded module (Megatron's group per layer and module)."""
        if not policy.offloads:
            return []
        mods = [m for m in OFFLOAD_MODULES if m in policy.offload_modules]
        lo = offset + self.recomputed(policy, offset, count)
        out = []
        for kind in self.kinds[lo:offset + count]:
            for m in mods:
                moved, freed = self._moved_and_freed(kind, policy.recompute_modules, (m,))
                if moved:
                    out.append(Group(moved=moved, freed=freed))
        return out

    def host_bytes(self, policy: StagePolicy, offset: int, count: int) -> int:
        """Host bytes one microbatch of the stage holds while offloaded."""
        if not policy.offloads:
            return 0
        n = self.recomputed(policy, offset, count)
        moved = self.offloaded(policy.recompute_modules, policy.offload_modules).moved
        return int(policy.offload_fraction * (moved[offset + count] - moved[offset + n]))


Fits = Callable[[int, StageCost], bool]
"""fits(virtual stage, its cost): the stage's rank stays within memory."""


@dataclass(frozen=True, kw_only=True)
class Fixed:
    """A given policy per virtual stage: what `simulate` runs."""

    costs: PolicyCosts
    """The per-module layer costs."""
    policies: tuple[StagePolicy, ...]
    """One per virtual stage."""
    delta: Delta | None = None
    """Megatron's per-rank offload delta, where the policy has one."""

    def stage_cost(self, offset: int, count: int, index: int, first: bool, last: bool,
                   receives: bool, fits: Fits | None = None) -> StageCost:
        p = self.policies[index]
        c = self.costs.stage_cost(p, offset, count, first, last, receives)
        held = self.delta.held(self.costs, p, offset, count, index) if self.delta else 0
        # The groups the delta keeps sit in the first chunks, held through the peak.
        return replace(c, static_bytes=c.static_bytes + held) if held else c

    def policy_of(self, offset: int, count: int, index: int, first: bool, last: bool,
                  receives: bool, fits: Fits | None = None) -> StagePolicy:
        return self.policies[index]


@dataclass(frozen=True, kw_only=True)
class Delta:
    """--delta-offload-bytes-across-pp-ranks on a pipeline (ppsim.policy.delta)."""

    step_bytes: int
    """The delta: pp rank r keeps r x this many bytes of offload groups per iteration."""
    pp: int
    vpp: int
    microbatches: int

    def held(self, costs: PolicyCosts, p: StagePolicy, offset: int, count: int,
             index: int) -> int:
        """What virtual stage `index` holds at its rank's peak for the groups the delta
        keeps. Megatron spends the budget on the chunks in backward order: the rank's
        last virtual stage's first microbatches, all in flight at the peak (pp - r of
        them under 1F1B, pp under the interleaved schedule); a budget beyond that
        stage's first chunks is priced as if spent within them."""
        rank = index % self.pp
        if not p.offloads or index // self.pp != self.vpp - 1:
            return 0
        inflight = self.pp - rank if self.vpp == 1 else self.pp
        return delta_held_bytes(costs.groups(p, offset, count), self.microbatches,
                                inflight, rank, self.step_bytes, p.offload_fraction)


def copies_stall(c: StageCost) -> bool:
    """A stage's copies outlast what hides them: the copy out the B after its F, the copy
    back the F before its B (the ops' own time; ppsim.sim.copies.estimated adds the
    rest)."""
    return c.copy_ms > min(c.forward_ms, c.backward_ms)


def _work(c: StageCost) -> float:
    return c.forward_ms + c.backward_ms


@dataclass(kw_only=True)
class Cheapest:
    """Each stage takes the policy of `groups` that fits with the least added work: the
    per-stage space (offload only where the host link hides its copies). Within a group
    (module sets, offload) N runs from 0 up and work grows with N, so the least N that
    fits is the cheapest (`_least_n`)."""

    costs: PolicyCosts
    """The per-module layer costs."""
    groups: Sequence[StagePolicy]
    """Policies with N = 0; each is also tried with every N up to the stage's layers."""
    inflight: Sequence[int] = ()
    """Per stage, the most microbatches it holds at once (host memory's multiplier)."""

    def _host_ok(self, p: StagePolicy, offset: int, count: int, index: int) -> bool:
        if not p.offloads or not self.inflight:
            return True
        held = self.costs.host_bytes(p, offset, count) * self.inflight[index]
        return held <= self.costs.host_limit_bytes

    def policy_of(self, offset: int, count: int, index: int, first: bool, last: bool,
                  receives: bool, fits: Fits | None = None) -> StagePolicy:
        priced: dict[StagePolicy, StageCost] = {}

        def raw(p: StagePolicy) -> StageCost:  # its ops without the stalls `estimated` adds
            c = priced.get(p)
            if c is None:
                c = priced[p] = self.costs.stage_cost(p, offset, count, first, last, receives)
            return c

        def ok(p: StagePolicy) -> bool:
            # A copy that stalls the stage is left out, so no choice adds forward time
            # and the cheapest is the fastest (priced as the planner prices it).
            c = raw(p)
            return ((fits is None or fits(index, estimated(c)))
                    and self._host_ok(p, offset, count, index) and not copies_stall(c))

        best: tuple[float, int, StagePolicy] | None = None
        most = 0 if self.costs.combined else count
        for g in self.groups:
            if best is not None and _work(raw(g)) > best[0]:
                continue  # the group's least work (at N = 0, no stall) is already more
            least = 0 if ok(g) else self._least_n(g, offset, most, ok)
            if least is None:
                continue  # no N fits
            p = _with_n(g, least)
            c = estimated(raw(p))
            key = (_work(c), c.static_bytes + c.activation_bytes)
            if best is None or key < best[:2]:
                best = (key[0], key[1], p)
        if best is not None:
            return best[2]

        def held(p: StagePolicy) -> int:
            c = estimated(raw(p))
            return c.static_bytes + c.activation_bytes
        # Nothing fits: the least memory, for the planner to refuse.
        return min((_with_n(g, most) for g in self.groups), key=held)

    def _least_n(self, g: StagePolicy, offset: int, most: int,
                 fits: Callable[[StagePolicy], bool]) -> int | None:
        """The least N in 1..most with which `g` fits, or None. Host memory and copy time
        shrink as N grows (block layers offload nothing); device memory too, except at
        PolicyCosts.memory_rises. Between two rises the N that fit are a suffix: the
        first span whose last N fits holds the least, found by bisection."""
        if most < 1:
            return None  # no whole layer may be recomputed (the combined 1F1B)
        rises = self.costs.memory_rises(g, offset, most)
        for start, end in zip(rises, [*rises[1:], most + 1], strict=True):
            lo, hi = start, end - 1
            if not fits(_with_n(g, hi)):
                continue
            while lo < hi:
                mid = (lo + hi) // 2
                if fits(_with_n(g, mid)):
                    hi = mid
                else:
                    lo = mid + 1
            return lo
        return None

    def stage_cost(self, offset: int, count: int, index: int, first: bool, last: bool,
                   receives: bool, fits: Fits | None = None) -> StageCost:
        p = self.policy_of(offset, count, index, first, last, receives, fits)
        return self.costs.stage_cost(p, offset, count, first, last, receives)


def _with_n(p: StagePolicy, n: int) -> StagePolicy:
    return StagePolicy(recompute_modules=p.recompute_modules, recompute_layers=n,
                       offload_modules=p.offload_modules, offload_fraction=p.offload_fraction)
