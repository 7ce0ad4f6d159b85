"""The torch engine's per-op trace: torch.distributed.pipelining's own stage methods timed.

Every torch schedule (1F1B and GPipe's loops, `_PipelineScheduleRuntime` and the
interleaved, zero-bubble and V schedules built on it) runs an action through one of
three methods of the stage: `forward_one_chunk` (F), `backward_one_chunk` (B: the
whole backward, or the input gradient where the schedule splits it) and
`backward_weight_one_chunk` (W). Each stage instance gets its own wrapper of each,
which marks the start and the end on the ppsim engine's clock (the Recorder: host
nanoseconds on CPU, CUDA events on GPU, so no sync is added). Torch waits for an
op's received tensors before it calls the method, as the ppsim engine starts an op
once its message is in, and computes the last stage's loss just after its forward,
outside it (the schedule's `_maybe_compute_loss`): that F is stretched to the loss's
end, as the ppsim engine's last-stage F holds its loss. A whole backward in an order
that splits backwards (DualPipeV's) is ppsim's B followed at once by its W
(ppsim.schedules.torchcsv): it is recorded so, the W of no length at the B's end, so
each action of ppsim's list has its op. Sends and receives are not
recorded: torch posts them in batches whose waits it makes wherever its loop needs
them, and has no point where one message's transfer begins and ends.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from ppsim.executor.recorder import Recorder

HOOKS = (("forward_one_chunk", "F"), ("backward_one_chunk", "B"),
         ("backward_weight_one_chunk", "W"))
"""torch's per-action stage methods and the op kind of each (looked up on each stage, not
assumed: a torch without one is timed whole)."""


class OpTrace:
    """Records this rank's torch stages' F, B and W into `rec`, op by op. `hooked` is
    False (with a note on stderr) where this torch's stages lack a method of HOOKS: its
    iterations are then timed whole only."""

    def __init__(self, rec: Recorder, split: Any, stages: list[Any], runner: Any,
                 split_backward: bool = False) -> None:
        self.rec, self.split_backward = rec, split_backward
        self._loss_pending = False
        """The last op was a last stage's F, whose loss torch computes next."""
        missing = sorted({name for name, _ in HOOKS for st in stages
                          if not callable(getattr(st, name, None))})
        self.hooked = not missing
        if missing:
            import torch

            sys.stderr.write(f"ppsim: torch {torch.__version__}'s PipelineStage has no "
                             f"{', '.join(missing)}: the torch engine is timed per "
                             "iteration only, without a per-op trace\n")
            return
        for st in stages:
            chunk = split.stage_chunk(st.stage_index)
            for name, kind in HOOKS:
                setattr(st, name, self._timed(getattr(st, name), kind, st.stage_index, chunk,
                                              bool(st.is_last)))
        loss = getattr(runner, "_maybe_compute_loss", None)
        if callable(loss):
            runner._maybe_compute_loss = self._with_loss(loss)

    def _timed(self, fn: Callable[..., Any], kind: str, stage: int, chunk: int,
               last: bool) -> Callable[..., Any]:
        rec = self.rec

        def run(*args: Any, **kwargs: Any) -> Any:
            self._loss_pending = False
            # the microbatch: the first argument, as every schedule passes it
            mb = args[0] if args else kwargs.get("fwd_chunk_id", kwargs.get("bwd_chunk_id"))
            before = rec.memory()
            rec.begin_op()
            start = rec.mark()
            out = fn(*args, **kwargs)
            end, after = rec.mark(), rec.memory()
            rec.op(start, end, kind, stage, chunk, int(mb), before, after)
            if kind == "B" and self.split_backward and _whole(args, kwargs):
                rec.op(end, end, "W", stage, chunk, int(mb), after, after)
            self._loss_pending = kind == "F" and last
            return out

        return run

    def _with_loss(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            out = fn(*args, **kwargs)
            if self._loss_pending:
                self.rec.stretch(self.rec.mark())
            self._loss_pending = False
            return out

        return run


def _whole(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a backward_one_chunk(bwd_chunk_id, loss, full_backward, ...) call is whole
    (torch's default)."""
    return bool(kwargs.get("full_backward", args[2] if len(args) > 2 else True))
