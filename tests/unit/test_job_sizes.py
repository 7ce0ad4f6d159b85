"""The sizes `plan --gpus` offers: each one Megatron accepts."""

from __future__ import annotations

from ppsim.cli.flags import config_from_args
from ppsim.cli.main import build_parser
from ppsim.job.shapes import shapes


def _arch(*argv: str):
    return config_from_args(build_parser().parse_args(["simulate", *argv])).model.arch


def test_every_expert_parallel_size_dividing_the_experts_is_offered() -> None:
    # Megatron-LM d98e8a6: arguments.py asserts num_experts % ep == 0; parallel_state.py
    # world_size % (etp x ep x pp) == 0. Kimi-K2's 384 experts on 1,536 GPUs at pp 16
    # (tp 1: etp 1) leave 96 ranks for the experts.
    a = _arch("--preset", "kimi-k2")
    found = {s.ep for s in shapes(a, 1536, 1536, 8, 61, {"tp": 1, "cp": 1, "pp": 16})}
    assert found == {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 96}
