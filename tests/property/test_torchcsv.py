"""torch.distributed.pipelining CSV interop, checked against torch's own code.

torch's schedule classes build their orders in the constructor and need only
a stage's group size, group rank and stage count to do it (no process group
talks while an order is built), so `_stage` hands them exactly those fields.
The CSVs read here are written by torch's `_dump_csv`; the round trip goes
through torch's `_PipelineScheduleRuntime._load_csv`, which validates the order
and lowers it with its send/recv pass.
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ppsim.cli.main import main
from ppsim.errors import UserError
from ppsim.schedules.generators import SCHEDULES, build_schedule
from ppsim.schedules.torchcsv import load_actions_csv, parse_actions_csv, to_torch_csv

torch = pytest.importorskip("torch")


def _torch_schedules():
    """torch's pipelining schedules, imported when a test runs: the import takes ~3 s of
    CPU, which every test worker would pay at collection."""
    return pytest.importorskip("torch.distributed.pipelining.schedules")


def _stages(pp: int, vpp: int) -> list:
    return [types.SimpleNamespace(group_size=pp, group_rank=0, num_stages=pp * vpp,
                                  stage_index=i, submod=torch.nn.Identity(),
                                  is_first=i == 0, is_last=i == pp * vpp - 1)
            for i in range(vpp)]


def torch_dump(schedule_obj, path: Path, fmt: str) -> str:
    schedule_obj._dump_csv(str(path), format=fmt)
    return path.read_text()


TORCH_CLASSES = {"interleaved-1f1b": "ScheduleInterleaved1F1B",
                 "interleaved-zb": "ScheduleInterleavedZeroBubble",
                 "zbv": "ScheduleZBVZeroBubble", "dualpipev": "ScheduleDualPipeV"}


@st.composite
def shapes(draw, names=tuple(SCHEDULES)):
    name = draw(st.sampled_from(names))
    pp = draw(st.integers(1, 4))
    if name in ("zbv", "dualpipev"):
        vpp = 2
    elif name == "interleaved-1f1b":
        vpp = draw(st.integers(2, 3))
    elif name in ("interleaved-zb", "gpipe"):
        vpp = draw(st.integers(1, 3))
    else:
        vpp = 1
    m = draw(st.integers(2 * pp if name == "dualpipev" else 1, 2 * pp + 3))
    return name, pp, vpp, m


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shapes())
def test_every_schedule_round_trips_through_torchs_load_csv(tmp_path, shape):
    name, pp, vpp, m = shape
    ours = build_schedule(name, pp, vpp, m)
    path = tmp_path / "order.csv"
    path.write_text(to_torch_csv(ours))
    runtime = _torch_schedules()._PipelineScheduleRuntime(_stages(pp, vpp), m)
    runtime._load_csv(str(path))  # torch validates it and adds its send/recv actions
    for fmt in ("compute_only", "compute_comms"):
        back = parse_actions_csv(torch_dump(runtime, tmp_path / f"{fmt}.csv", fmt), pp, vpp, m)
        assert back.actions == ours.actions, fmt
        assert back.split_backward == ours.split_backward
        assert back.placement == ours.placement or pp == 1  # one rank: the same placement
    assert any("SEND" in n for n in back.notes) == (pp > 1)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shapes(), st.sampled_from(["\n", "\r\n"]), st.booleans())
def test_a_streamed_file_reads_as_its_text(tmp_path, shape, newline, bom):
    """load_actions_csv reads line by line; parse_actions_csv the whole text: one answer,
    whatever the line ends and a BOM."""
    name, pp, vpp, m = shape
    text = ("\ufeff" if bom else "") + to_torch_csv(build_schedule(name, pp, vpp, m)).replace(
        "\r\n", newline)
    path = tmp_path / "order.csv"
    path.write_bytes(text.encode())
    assert load_actions_csv(str(path)) == parse_actions_csv(text)


def _torch_order(name: str, pp: int, vpp: int, m: int):
    return getattr(_torch_schedules(), TORCH_CLASSES[name])(_stages(pp, vpp), m)


@pytest.mark.parametrize("name", list(TORCH_CLASSES))
@pytest.mark.parametrize("pp, m", [(2, 4), (3, 6), (4, 8), (4, 6), (4, 10), (2, 3)])
def test_torchs_own_orders_are_ppsims(tmp_path, name, pp, m):
    """Every CSV torch writes reads back, and equals ppsim's schedule of the same name."""
    vpp = 2
    try:
        obj = _torch_order(name, pp, vpp, m)
    except ValueError:
        pytest.skip(f"torch refuses {name} pp {pp} m {m}")
    ours = build_schedule(name, pp, vpp, m)
    only = parse_actions_csv(torch_dump(obj, tmp_path / "a.csv", "compute_only"), pp, vpp, m)
    comms = parse_actions_csv(torch_dump(obj, tmp_path / "b.csv", "compute_comms"), pp, vpp, m)
    assert only.actions == comms.actions == ours.actions
    assert only.split_backward and ours.split_backward or name == "interleaved-1f1b"
    notes = " ".join(comms.notes)
    assert "SEND/RECV" in notes and "UNSHARD/RESHARD/REDUCE_GRAD" in notes
    if name == "dualpipev":
        assert "OVERLAP_F_B" in torch_dump(obj, tmp_path / "c.csv", "compute_only")
        assert any("OVERLAP_F_B" in n for n in only.notes)
        assert any("whole backward" in n for n in only.notes)


def test_interleaved_counts_torch_runs_and_megatron_refuses(tmp_path):
    # The cases: pp 4, vpp 2, m 6 and m 10 run in torch; ppsim matches them.
    for m in (6, 10):
        obj = _torch_order("interleaved-1f1b", 4, 2, m)
        got = parse_actions_csv(torch_dump(obj, tmp_path / "o.csv", "compute_only"))
        assert got.actions == build_schedule("interleaved-1f1b", 4, 2, m).actions


def test_overlap_and_sharding_cells_by_hand():
    text = ("0UNSHARD,0F0,0SEND_F0,,0RECV_B0,0B0,0REDUCE_GRAD,0RESHARD\n"
            "1RECV_F0,(1F0;1B0)OVERLAP_F_B,1SEND_B0\n")
    s = parse_actions_csv(text)
    assert [str(a) for a in s.actions[1]] == ["1F0", "1B0"]
    assert (s.pp, s.vpp, s.microbatches, s.split_backward) == (2, 1, 1, False)
    assert len(s.notes) == 3


def test_v_placement_is_read_from_where_stages_run():
    s = parse_actions_csv("0F0,1F0,1B0,0B0\n")
    assert (s.pp, s.vpp, s.placement) == (1, 2, "loop")
    v = build_schedule("zbv", 2, 2, 3)
    assert parse_actions_csv(to_torch_csv(v)).placement == "v"


@pytest.mark.parametrize("text, match", [
    ("0F¹,0B0\n", "cannot read"),                       # superscript digit
    ("0F" + "9" * 5000 + ",0B0\n", "cannot read"),       # 5,000-digit count
    ("0F0,0X0\n", "cannot read"),
    ("0F,0B0\n", "names no microbatch"),
    ("0F0,0B0\n1F0,1B0\n", "pipeline.pp"),              # two rows, but pp = 1 asked
    ("0F0,0F1,0B0\n", "missing"),
    ("0F0,0B0,0F0\n", "twice"),
    ("", "no actions"),
    ("0F0,1F0,1B0,0B0\n1F0\n", "runs on ranks"),
    ("0F0,0B0,0F999999999,0B999999999\n", "above the limit"),
])
def test_malformed_csv_is_one_user_error(text, match):
    with pytest.raises(UserError, match=match):
        parse_actions_csv(text, 1 if "pipeline.pp" in match else None)


@pytest.mark.parametrize("data", [b"\xff\xfe0F0,0B0\n", "0F²,0B0\n".encode(),
                                  ("0F" + "7" * 5000 + "\n").encode()])
@pytest.mark.parametrize("command", ["simulate", "plan", "schedule"])
def test_hostile_csv_files_exit_2_with_one_line(tmp_path, capsys, data, command):
    path = tmp_path / "order.csv"
    path.write_bytes(data)
    assert main([command, "--pp", "1", "--actions-csv", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pipeline.actions_csv" in err and "Traceback" not in err


def test_schedule_command_writes_what_torch_loads(tmp_path, capsys):
    out = tmp_path / "zb.csv"
    assert main(["schedule", "--pp", "4", "--vpp", "2", "--microbatches", "6", "--schedule",
                 "interleaved-zb", "--csv", str(out), "--json"]) == 0
    import json

    doc = json.loads(capsys.readouterr().out)
    assert doc["rule"].startswith("torch's rule") is False and "groups of 6" in doc["rule"]
    ours = build_schedule("interleaved-zb", 4, 2, 6)
    assert out.read_bytes() == to_torch_csv(ours).encode()  # byte for byte, \r\n as torch
    runtime = _torch_schedules()._PipelineScheduleRuntime(_stages(4, 2), 6)
    runtime._load_csv(str(out))
    assert load_actions_csv(str(out), 4, 2, 6).actions == ours.actions


def test_simulate_and_plan_take_the_csv_as_the_schedule(tmp_path, capsys):
    import json

    out = tmp_path / "zbv.csv"
    flags = ["--pp", "2", "--vpp", "2", "--microbatches", "4", "--num-layers", "8"]
    assert main(["schedule", *flags, "--schedule", "zbv", "--csv", str(out)]) == 0
    capsys.readouterr()
    assert main(["simulate", *flags, "--schedule", "zbv", "--json"]) == 0
    named = json.loads(capsys.readouterr().out)
    # The config still says 1f1b: the CSV's order and its V placement win.
    assert main(["simulate", *flags, "--actions-csv", str(out), "--json"]) == 0
    res = capsys.readouterr()
    from_csv = json.loads(res.out)
    assert from_csv["schedule"] == "csv"
    assert from_csv["iteration_time_ms"] == pytest.approx(named["iteration_time_ms"])
    assert "note: actions CSV" in res.err
    assert main(["plan", *flags, "--schedule", "zbv", "--json", "--time-budget", "20"]) == 0
    plan_named = json.loads(capsys.readouterr().out)
    assert main(["plan", *flags, "--actions-csv", str(out), "--json",
                 "--time-budget", "20"]) == 0
    plan_csv = json.loads(capsys.readouterr().out)
    assert plan_csv["best"]["split"] == plan_named["best"]["split"]
    assert main(["plan", *flags, "--actions-csv", str(out), "--search", "vpp"]) == 2


CELLS = st.sampled_from(["0F0", "0B0", "1F0", "1I0", "1W0", "0W0", "0I0", "1B0", "0F1",
                         "0B1", "1F1", "1B1", "", "0SEND_F0", "1RECV_F0", "0UNSHARD",
                         "(0F1;1B0)OVERLAP_F_B", "²", "0F", "F0", "0F" + "9" * 20, "\x00",
                         "(0F0", "0F0)", '"0F0"', "0 F0", "٣F0"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(CELLS, max_size=8), max_size=4), st.text(max_size=20))
def test_any_text_is_an_order_or_one_user_error(rows, noise):
    text = "\n".join(",".join(r) for r in rows) + noise
    try:
        s = parse_actions_csv(text)
    except UserError as exc:
        assert str(exc).startswith(("pipeline.", "schedule"))
        return
    # Whatever reads is a complete, valid order that writes back to itself.
    assert parse_actions_csv(to_torch_csv(s)).actions == s.actions


@pytest.mark.parametrize("name", ["dualpipev", "interleaved-zb"])
def test_plan_of_a_torch_csv_matches_brute_force(tmp_path, name):
    """The planner is exact for an order read from torch's CSV, as for a named schedule."""
    import itertools

    from ppsim.config.schema import config_from_dict
    from ppsim.pipeline.problem import build_problem
    from ppsim.pipeline.split import split_from_counts
    from ppsim.plan.planner import plan
    from ppsim.sim.simulate import simulate

    path = tmp_path / "order.csv"
    path.write_text(torch_dump(_torch_order(name, 2, 2, 4), tmp_path / "d.csv", "compute_comms"))
    problem = build_problem(config_from_dict({
        "model": {"kind": "uniform", "num_layers": 6, "forward_ms": 1.0, "backward_ms": 2.0,
                  "weight_grad_ms": 1.0, "activation_bytes": 100, "static_bytes": 300,
                  "head": {"forward_ms": 2.5, "backward_ms": 3.0}},
        "pipeline": {"pp": 2, "vpp": 2, "microbatches": 4, "actions_csv": str(path)},
        "hardware": {"memory_bytes": 1e12, "p2p_latency_ms": 0.25}}))
    assert problem.schedule.name == "csv"
    best = min(
        simulate(problem.with_split(split_from_counts(c, 2, 2, 6, problem.split.placement)))
        .summary.iteration_time_ms
        for c in itertools.product(range(7), repeat=4) if sum(c) == 6)
    res = plan(problem, top_k=1)
    assert res.proven_optimal and res.best.summary.iteration_time_ms == pytest.approx(best)
