"""The TUI's pure logic, without a terminal."""

from __future__ import annotations

import pytest
from helpers import simulate_json
from hypothesis import given
from hypothesis import strategies as st

from ppsim.config.schema import load_config
from ppsim.config.to_toml import config_to_toml
from ppsim.pipeline.problem import build_problem
from ppsim.sim.simulate import simulate
from ppsim.tui.editing import (
    EditRefused,
    History,
    click_to_boundary,
    drag_boundary,
    move_boundary,
    parse_float,
    parse_int,
    set_count,
)
from ppsim.tui.lanes import Lane, LaneOp, fit_scale, lane_cells, ruler, sim_lanes
from ppsim.tui.memory import Bar, bar_cells
from ppsim.tui.session import (
    apply_setting,
    check_state,
    config_for,
    evaluate_state,
    state_from_config,
)


def test_move_boundary_grows_and_shrinks() -> None:
    assert move_boundary((5, 3), 0, +1) == (6, 2)
    assert move_boundary((5, 3), 0, -2) == (3, 5)
    assert move_boundary((2, 2, 2, 2), 2, +1) == (2, 2, 3, 1)


def test_move_boundary_refuses_invalid() -> None:
    with pytest.raises(EditRefused):
        move_boundary((8, 0), 0, +1)  # stage 1 has nothing to give
    with pytest.raises(EditRefused):
        move_boundary((5, 3), 1, +1)  # no boundary after the last stage
    with pytest.raises(EditRefused):
        move_boundary((5, 3), -1, +1)


@given(st.lists(st.integers(0, 6), min_size=2, max_size=8), st.data())
def test_edits_keep_the_layer_count(counts: list[int], data: st.DataObject) -> None:
    b = data.draw(st.integers(0, len(counts) - 2))
    pos = data.draw(st.integers(-3, sum(counts) + 3))
    out = drag_boundary(counts, b, pos)
    assert sum(out) == sum(counts) and min(out) >= 0
    stage = data.draw(st.integers(0, len(counts) - 1))
    layer = data.draw(st.integers(0, max(0, sum(counts) - 1)))
    out = click_to_boundary(counts, stage, layer)
    assert sum(out) == sum(counts) and min(out) >= 0
    try:
        out = set_count(counts, stage, data.draw(st.integers(-2, 12)))
    except EditRefused:
        return
    assert sum(out) == sum(counts) and min(out) >= 0


def test_click_moves_the_nearest_boundary() -> None:
    assert click_to_boundary((5, 3), 0, 6) == (7, 1)  # right of stage 0: its end moves
    assert click_to_boundary((5, 3), 1, 2) == (2, 6)  # left of stage 1: its start moves
    assert click_to_boundary((5, 3), 0, 1) == (2, 6)  # inside: end moves after the layer


def test_set_count_uses_a_neighbour() -> None:
    assert set_count((5, 3), 0, 4) == (4, 4)
    assert set_count((5, 3), 1, 1) == (7, 1)
    with pytest.raises(EditRefused):
        set_count((5, 3), 0, 9)
    with pytest.raises(EditRefused):
        set_count((5, 3), 0, -1)


def test_field_parsing() -> None:
    assert parse_int("pp", " 4 ") == 4
    with pytest.raises(EditRefused, match="not a whole number"):
        parse_int("pp", "four")
    with pytest.raises(EditRefused, match="at least 1"):
        parse_int("microbatches", "0")
    assert parse_float("memory_gb", "80") == 80.0
    with pytest.raises(EditRefused):
        parse_float("memory_gb", "nan")
    for bad in ("inf", "-inf", "nan", "1e999"):
        with pytest.raises(EditRefused):
            parse_float("memory_gb", bad)


def test_history_undo_redo() -> None:
    h = History(1)
    h.push(2)
    h.push(3)
    assert h.undo() == 2 and h.undo() == 1 and h.undo() is None
    assert h.redo() == 2
    h.push(5)
    assert h.redo() is None and h.current == 5
    h.push(5)  # no-op edits are not recorded
    assert h.undo() == 2


def test_apply_setting_checks_everything() -> None:
    base = load_config(None)
    s = state_from_config(base)
    assert s.counts == (6, 2) and s.pp == 2
    s2 = apply_setting(base, s, "vpp", "2")
    assert s2.vpp == 2 and s2.schedule == "interleaved-1f1b" and s2.counts == (2, 2, 2, 2)
    s3 = apply_setting(base, s, "pp", "4")
    assert s3.counts == (2, 2, 2, 2)
    for name, text in (("microbatches", "0"), ("pp", "x"), ("memory_gb", "-1"),
                       ("memory_gb", "inf"), ("schedule", "zb"), ("model", "nope"),
                       ("pp", "1000000000"), ("microbatches", "1000000000"),
                       ("microbatches", "100000")):
        with pytest.raises(EditRefused):
            apply_setting(base, s, name, text)
    # interleaved-1f1b runs any microbatch count (Megatron's groups, else torch's rule)
    assert apply_setting(base, s2, "microbatches", "7").microbatches == 7
    # dualpipev needs 2 x pp microbatches: the core says so when the problem is built
    # (in the simulation worker), not a rule of the TUI's own
    dp = apply_setting(base, apply_setting(base, s, "schedule", "dualpipev"), "microbatches", "3")
    with pytest.raises(EditRefused, match="microbatches"):
        check_state(base, dp, "microbatches")
    s4 = apply_setting(base, s, "hardware", "h100-80gb")
    assert s4.memory_bytes == 80e9
    s5 = apply_setting(base, s, "model", "llama3-8b")
    assert sum(s5.counts) == 32


def test_the_tui_has_no_divisibility_rule_of_its_own() -> None:
    """Whatever the core accepts, the TUI accepts: 80 layers on pp 3, vpp 3 on 8 layers,
    more ranks than layers."""
    base = load_config(None)
    s = state_from_config(base)
    for name, text, n in (("vpp", "3", 6), ("pp", "9", 9)):
        out = apply_setting(base, s, name, text)
        assert len(out.counts) == n and sum(out.counts) == 8
        check_state(base, out, name)
    llama = apply_setting(base, apply_setting(base, s, "model", "llama3-70b"), "pp", "3")
    assert sum(llama.counts) == 80 and len(llama.counts) == 3
    check_state(base, llama, "pp")


def test_config_round_trip_and_evaluation_matches_simulate() -> None:
    base = load_config(None)
    s = state_from_config(base)
    cfg = config_for(base, s)
    assert state_from_config(cfg) == s
    result = evaluate_state(base, s)
    ref = result.sim.summary
    assert result.pinned_counts == (4, 4) and result.pinned_is_even
    even = load_config(None)
    even.pipeline.split = [4, 4]
    assert result.pinned.summary == simulate(build_problem(even)).summary
    assert result.speedup == pytest.approx(result.baseline_ms / ref.iteration_time_ms)
    pinned = evaluate_state(base, s, (6, 2))
    assert pinned.pinned_counts == (6, 2) and not pinned.pinned_is_even
    # a pinned split of another shape falls back to the even split
    assert evaluate_state(base, s, (2, 2, 2, 2)).pinned_counts == (4, 4)


def test_lane_cells_map_ops_to_columns() -> None:
    ops = (LaneOp(0.0, 4.0, "F", 0, 0, 0), LaneOp(6.0, 8.0, "B", 0, 1, 0),
           LaneOp(8.0, 8.5, "W", 0, 1, 0))
    lane = Lane("r0", ops)
    cells = lane_cells(lane, 1.0, 0, 10)
    text = "".join(c.text for c in cells)
    assert text == "F0  ··bbw·"  # b1 is too short for its label; odd mb: lower case
    assert [c.op for c in cells] == [0, -1, 1, 2, -1]
    # a scrolled viewport starts mid-op
    assert "".join(c.text for c in lane_cells(lane, 1.0, 2, 4)) == "FF··"
    # zoomed out: a cell shows the op at its midpoint or, with the midpoint idle, the
    # op with more of it; a cell the rank is busy in for less than half reads '░'
    # unless the cursor is in it
    assert [c.op for c in lane_cells(lane, 8.0, 0, 2)] == [0, -1]
    assert [c.text for c in lane_cells(lane, 8.0, 0, 3)] == ["F", "░", "·"]
    assert [c.op for c in lane_cells(lane, 8.0, 0, 2, force=1)] == [1, -1]
    assert [c.op for c in lane_cells(lane, 8.0, 0, 2, force=2)] == [0, 2]
    assert lane.at_time(7.0) == 1 and lane.overlapping(4.0, 6.0) == -1


def test_ruler_and_scale() -> None:
    assert ruler(1.0, 0, 25).startswith("|0ms      |10ms     |20ms")
    assert fit_scale(100.0, 101) == 1.0
    from ppsim.tui.lanes import fmt_ms

    assert [fmt_ms(x) for x in (0, 0.5, 12.5, 3200, 2.16e6, 7.2e7)] == \
        ["0ms", "500us", "12.5ms", "3.2s", "36min", "20h"]


def test_sim_lanes_cover_every_op() -> None:
    sim = simulate(build_problem(load_config(None)))
    lanes = sim_lanes(sim)
    assert [len(lane.ops) for lane in lanes] == [len(o) for o in sim.timeline.ops]
    assert max(lane.end for lane in lanes) == pytest.approx(sim.summary.iteration_time_ms)


def test_memory_bar_cells() -> None:
    fits = Bar(0, 20, 30, 50, True)
    assert bar_cells(fits, 100, 10) == (2, 3, 5)
    over = Bar(1, 100, 100, 200, False)
    assert sum(bar_cells(over, 100, 10)[:2]) == 10


def test_cli_registers_tui_and_refuses_bad_input_before_opening(capsys) -> None:
    from ppsim.cli.main import COMMANDS, build_parser, main

    build_parser()
    assert "tui" in COMMANDS
    assert main(["tui", "--split", "9,9"]) == 2
    assert "pipeline.split" in capsys.readouterr().err
    assert main(["tui", "--trace", "/nonexistent/trace.json"]) == 2


def test_tui_cli_imports_without_textual() -> None:
    import subprocess
    import sys

    code = "import sys, ppsim.cli.tui; assert 'textual' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("schedule", ["gpipe", "zb-h1", "zbv", "dualpipev"])
def test_switching_schedule_picks_a_vpp_it_takes(schedule: str, tmp_path) -> None:
    from ppsim.schedules.generators import SCHEDULES

    if schedule not in SCHEDULES:
        pytest.skip(f"{schedule} not in this ppsim")
    base = load_config(None)
    s = apply_setting(base, state_from_config(base), "schedule", schedule)
    result = evaluate_state(base, s)
    path = tmp_path / "saved.toml"
    path.write_text(config_to_toml(config_for(base, s)))  # what the TUI saves
    ref = simulate_json(path)
    assert result.sim.summary.iteration_time_ms == ref["iteration_time_ms"]
    assert (s.schedule, s.vpp, list(s.counts)) == (ref["schedule"], ref["vpp"], ref["split"])
    assert s.split.placement == result.sim.problem.split.placement
    kinds = {op.kind for lane in sim_lanes(result.sim) for op in lane.ops}
    assert kinds == ({"F", "B", "W"} if result.sim.problem.schedule.split_backward
                     else {"F", "B"})


def test_export_of_a_v_placement_says_megatron_cannot() -> None:
    from ppsim.pipeline.split import Split
    from ppsim.tui.exports import export_text, read_export

    text = export_text(Split((2, 2, 2, 2), 2, 2, "v"))
    assert "Megatron: n/a" in text and "MEGATRON_ARGS" not in read_export(text)
    assert "TORCHTITAN_FQNS" in read_export(text)


def test_export_of_a_v_split_with_an_empty_stage_says_torchtitan_cannot() -> None:
    """The planner may place no layer on a stage of a V; torchtitan refuses a model part
    with no parameter, so the export says why, rather than fail or export `[]`."""
    from ppsim.pipeline.split import Split
    from ppsim.tui.exports import export_text, read_export

    text = export_text(Split((4, 4, 4, 0, 6, 3, 3, 0), 4, 2, "v"))
    assert "TORCHTITAN_FQNS" not in read_export(text)
    assert "# torchtitan: n/a (stage 3 holds no module" in text


def test_export_of_a_hybrid_stack_is_its_piped_pattern() -> None:
    """A hybrid stack's export gives Megatron the pattern with | at the stages, and no
    layout (Megatron asserts it away beside --hybrid-layer-pattern); the TUI exported
    --pipeline-model-parallel-layout flags for it."""
    from ppsim.costs.hybrid import parse_pattern
    from ppsim.pipeline.split import Split
    from ppsim.tui.exports import export_text, read_export

    text = export_text(Split((4, 4), 2, 1, "loop"), pattern=parse_pattern("M-*-G-E-"))
    got = read_export(text)
    assert "--hybrid-layer-pattern 'M-*-|G-E-'" in got["MEGATRON_ARGS"]
    assert "--pipeline-model-parallel-layout" not in got["MEGATRON_ARGS"]
    assert "MEGATRON_LAYOUT_ARGS" not in got and "layout: n/a" in text


def test_compare_falls_back_when_shapes_differ(tmp_path) -> None:
    import io
    from contextlib import redirect_stdout

    from ppsim.cli.main import main
    from ppsim.trace.read import read_trace
    from ppsim.tui.compare import compare

    path = tmp_path / "pp4.json"
    with redirect_stdout(io.StringIO()):
        assert main(["simulate", "--pp", "4", "--split", "2,2,2,2", "--trace", str(path)]) == 0
    sim = simulate(build_problem(load_config(None)))
    cmp = compare(sim, read_trace(str(path)))
    assert cmp.hidden  # issue 26: another shape's figures would mislead
    text = "\n".join(cmp.lines())
    assert "pp 4 (simulated 2)" in text and "figures are hidden" in text
    assert "error" not in text and "%" not in text
