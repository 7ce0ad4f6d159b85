"""One "even" split: the planner's baseline, the TUI's even split and `ppsim split`
give the same counts for any layer count and stage count."""

from __future__ import annotations

import contextlib
import io
import json

from helpers import uniform_problem
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.cli.main import main
from ppsim.config.schema import config_from_dict
from ppsim.pipeline.split import near_even_counts
from ppsim.plan.planner import plan
from ppsim.tui.session import pinned_counts, state_from_config


def _split_cli(layers: int, pp: int, vpp: int, schedule: str) -> list[int]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["split", "--json", "--preset", "tiny-gpt", "--num-layers", str(layers),
                     "--pp", str(pp), "--vpp", str(vpp), "--schedule", schedule]) == 0
    return [s["layers"] for s in json.loads(out.getvalue())["stages"]]


def _tui_even(layers: int, pp: int, vpp: int, schedule: str) -> tuple[int, ...]:
    cfg = config_from_dict({"model": {"preset": "tiny-gpt", "num_layers": layers},
                            "pipeline": {"pp": pp, "vpp": vpp, "schedule": schedule}})
    return pinned_counts(state_from_config(cfg), None)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 30), st.integers(1, 6), st.sampled_from([1, 2]))
def test_planner_tui_and_split_agree_on_even(layers: int, pp: int, vpp: int) -> None:
    if pp == 1:
        vpp = 1
    stages = pp * vpp
    if layers < stages:
        layers = stages
    schedule = "interleaved-1f1b" if vpp > 1 else "1f1b"
    cli = _split_cli(layers, pp, vpp, schedule)
    assert sum(cli) == layers and max(cli) - min(cli) <= 1
    assert list(_tui_even(layers, pp, vpp, schedule)) == cli
    problem = uniform_problem(pp, vpp, pp * 2, schedule, counts=cli)
    baseline = plan(problem, top_k=1, time_budget_s=0.3).baseline
    assert baseline is not None and list(baseline.split.counts) == cli


def test_thirteen_on_six_leaves_the_end_stages_short() -> None:
    """The spare layer goes to a middle stage: the first and last stages (embedding,
    head) are left a layer short."""
    assert near_even_counts(13, 6) == (2, 3, 2, 2, 2, 2)
    assert _split_cli(13, 6, 1, "1f1b") == [2, 3, 2, 2, 2, 2]


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 64), st.integers(1, 400))
def test_spare_layers_go_to_the_middle_then_the_first_never_the_last(stages: int,
                                                                     layers: int) -> None:
    """The documented rule (README, docs/model.md): the near-even split gives its spare
    layers to the middle stages, then to the first (embedding), never to the last (head)."""
    if layers < stages:
        layers = stages
    counts = near_even_counts(layers, stages)
    q, spare = divmod(layers, stages)
    assert sum(counts) == layers and set(counts) <= {q, q + 1}
    assert counts[-1] == q
    middle = min(spare, max(0, stages - 2))
    assert sum(c == q + 1 for c in counts[1:-1]) == middle
    assert counts[0] == q + (spare - middle if stages > 1 else 0)
