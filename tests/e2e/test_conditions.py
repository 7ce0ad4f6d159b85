"""The run's conditions: what `ppsim profile` measures beyond one process alone (op times
with every device busy, gloo's per-message CPU time, ranks sharing a device, the
optimizer step) and how the simulator uses it. Real processes, nothing mocked."""

from __future__ import annotations

import json

import pytest
from helpers import uniform_problem

from ppsim.cli.main import main
from ppsim.config.schema import load_config
from ppsim.costs.costfile import cost_document, load_conditions, write_costs
from ppsim.pipeline.problem import build_problem, placement_warning
from ppsim.schedules.generators import B, W
from ppsim.sim.simulate import simulate
from ppsim.tui.cautions import state_warnings

torch = pytest.importorskip("torch")

from ppsim.executor.measure import profile  # noqa: E402

TINY = load_config(None).model.fields()


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> str:
    """A profile for ranks on devices [0, 0, 1]: two processes at once (one per device)
    exchanging messages, then two per device for the shared case."""
    doc = profile(TINY, "cpu", repeats=2, warmup=1, p2p=False, devices=[0, 0, 1], pin=True)
    path = str(tmp_path_factory.mktemp("cond") / "costs.json")
    write_costs(path, doc)
    return path


@pytest.mark.e2e
def test_profile_records_the_conditions_it_measured(measured):
    doc = json.loads(open(measured).read())
    cond = doc["conditions"]
    assert cond["devices"] == [0, 0, 1] and cond["processes"] == 2
    assert cond["message_cpu_ms"] >= 0 and cond["context_switch_ms"] >= 0
    assert cond["shared"]["ranks_per_device"] == 2
    assert cond["local_message_cpu_ms"] >= 0
    # Both timings are recorded; how far two processes on one core slow each other is a
    # timing, which the suite's own load moves (it failed a ratio of 1.3 under -n 2).
    assert cond["shared"]["layer_fb_shared_ms"] > 0 and cond["shared"]["layer_fb_alone_ms"] > 0
    opt = cond["optimizer"]
    assert opt["gbps"] > 0 and opt["fixed_ms"] >= 0
    # The solo times are kept beside the concurrent ones.
    assert doc["measurement"]["solo"]["layer"]["forward_ms"] > 0
    for layer in doc["layers"]:
        assert layer["split_backward_ms"] >= layer["backward_ms"] >= layer["weight_grad_ms"]
    c = load_conditions(measured)
    assert c is not None and c.devices == (0, 0, 1) and c.optimizer_gbps == opt["gbps"]
    assert c.local_message_cpu_ms == cond["local_message_cpu_ms"]
    # Each piece's parameters are recorded, so the optimizer step is simulated.
    n = sum(p.numel() for p in torch.nn.Linear(TINY["hidden_size"], TINY["hidden_size"])
            .parameters())
    assert doc["layers"][0]["params"] > 4 * n and doc["head"]["params"] > 0
    cfg = load_config(None)
    cfg.costs_file = measured
    sim = simulate(build_problem(cfg), record=True)
    steps = [s for _, _, s in sim.timeline.step]
    assert all(s >= opt["fixed_ms"] for s in steps) and max(steps) > opt["fixed_ms"]


def _with_conditions(tmp_path, **cond) -> str:
    p = uniform_problem(2, 1, 4, "1f1b", counts=[2, 2])
    doc = cost_document(p.costs, source="hand", model=None)
    doc["layers"] = [{**doc["layers"][0], "params": 1000}]
    doc["conditions"] = cond
    path = str(tmp_path / "c.json")
    write_costs(path, doc)
    return path


def _config(tmp_path, costs: str, placement: str = "") -> str:
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'costs_file = "{costs}"\n[model]\nkind = "uniform"\nnum_layers = 4\n'
                   f'[pipeline]\npp = 2\nmicrobatches = 4\nsplit = [2, 2]\n{placement}')
    return str(cfg)


def test_measured_conditions_feed_the_simulator(tmp_path):
    plain = _with_conditions(tmp_path, devices=[0, 1])
    base = simulate(build_problem(load_config(_config(tmp_path, plain)))).summary
    costs = _with_conditions(tmp_path, devices=[0, 1], message_cpu_ms=0.5,
                             optimizer={"fixed_ms": 0.25, "gbps": 1.0})
    p = build_problem(load_config(_config(tmp_path, costs)))
    assert p.topology is not None and p.topology.message_cpu_ms == 0.5
    assert p.hardware.optimizer_fixed_ms == 0.25 and p.hardware.memory_bandwidth_gbps == 1.0
    got = simulate(p).summary
    # Each rank's step: fixed + 28 B per parameter at 1 GB/s, after its last op; every
    # crossing message costs both ends CPU: the iteration only gets longer.
    assert got.iteration_time_ms > base.iteration_time_ms + 0.25 + 2000 * 28 / 1e6
    # A placement that sets its own message cost wins over the file's.
    own = build_problem(load_config(_config(tmp_path, costs,
                                            "[placement]\nmessage_cpu_ms = 0.1\n")))
    assert own.topology.message_cpu_ms == 0.1


def test_the_local_message_cost_charges_ranks_sharing_a_device(tmp_path):
    """The profile's cost of a message between two ranks of one device reaches the
    simulator where ranks share a device, and only there; a placement's own figure wins."""
    plain = _with_conditions(tmp_path, devices=[0, 0])
    shared = "[placement]\ndevices = [0, 0]\n"
    base = simulate(build_problem(load_config(_config(tmp_path, plain, shared)))).summary
    costs = _with_conditions(tmp_path, devices=[0, 0], local_message_cpu_ms=0.5)
    p = build_problem(load_config(_config(tmp_path, costs, shared)))
    assert p.topology is not None and p.topology.local_message_cpu_ms == 0.5
    got = simulate(p).summary
    assert got.iteration_time_ms > base.iteration_time_ms + 0.5
    apart = build_problem(load_config(_config(tmp_path, costs)))  # one device per rank
    assert apart.topology is None  # nothing shared: the classic, private model
    own = build_problem(load_config(_config(tmp_path, costs,
                                            shared + "local_message_cpu_ms = 0.1\n")))
    assert own.topology.local_message_cpu_ms == 0.1


def test_simulate_warns_when_the_placement_differs(tmp_path, capsys):
    costs = _with_conditions(tmp_path, devices=[0, 1])
    assert placement_warning(load_config(_config(tmp_path, costs))) is None
    cfg = _config(tmp_path, costs, "[placement]\ndevices = [0, 0]\n")
    assert main(["simulate", "--config", cfg]) == 0
    err = capsys.readouterr().err
    (line,) = [line for line in err.splitlines() if "profiled for 2 device(s)" in line]
    assert line.startswith("ppsim simulate: warning: ") and "re-run ppsim profile" in line
    # the TUI shows the same line for the state it opens on
    tui_cfg = load_config(cfg)
    assert line.removeprefix("ppsim simulate: ") in state_warnings(tui_cfg,
                                                                   build_problem(tui_cfg))
    # Same number of devices, but two ranks on one of them: measured for another sharing.
    four = _with_conditions(tmp_path, devices=[0, 1, 2, 3])
    cfg4 = tmp_path / "c4.toml"
    cfg4.write_text(f'costs_file = "{four}"\n[model]\nkind = "uniform"\nnum_layers = 4\n'
                    '[pipeline]\npp = 4\nmicrobatches = 4\n[placement]\ndevices = [0, 0, 1, 1]\n')
    assert placement_warning(load_config(str(cfg4))) is not None
    cfg4.write_text(cfg4.read_text().replace("[0, 0, 1, 1]", "[3, 2, 1, 0]"))
    assert placement_warning(load_config(str(cfg4))) is None


def test_a_split_backward_runs_its_measured_path():
    """B of a split schedule lasts split_backward_ms - W; 1F1B's B the one-pass backward."""
    zb = uniform_problem(2, 1, 4, "zb-h1", counts=[1, 1], b=2.0, w=0.5, split_b=2.5)
    ob = uniform_problem(2, 1, 4, "1f1b", counts=[1, 1], b=2.0, w=0.5, split_b=2.5)
    for problem, want in ((zb, {B: 2.0, W: 0.5}), (ob, {B: 2.0})):
        ops = simulate(problem, record=True).timeline.ops
        for kind, dur in want.items():
            got = {round(o.end - o.start, 9) for r in ops for o in r if o.action.kind == kind}
            assert got == {dur}, (problem.schedule.name, kind, got)


def test_bad_conditions_are_refused_naming_the_field(tmp_path, capsys):
    costs = _with_conditions(tmp_path, devices=[0, 1])
    doc = json.loads(open(costs).read())
    for field in ("message_cpu_ms", "local_message_cpu_ms"):
        doc["conditions"] = {"devices": [0, 1], field: -1}
        with open(costs, "w") as fh:  # by hand: write_costs itself refuses it
            json.dump(doc, fh)
        assert main(["simulate", "--config", _config(tmp_path, costs)]) == 2
        assert f"conditions.{field}" in capsys.readouterr().err


@pytest.mark.e2e
def test_ranks_placed_on_one_core_run_pinned_with_the_same_losses(launches):
    import os

    # Both: the default config, 2 iterations, 1 warm-up (the first pooled with other tests).
    alone, shared = launches.get("default").summary, launches.get("default-one-core").summary
    assert shared["losses"] == pytest.approx(alone["losses"], rel=1e-6)
    # Both ranks ran pinned to one core, the first this process may use; unplaced ranks
    # keep every core.
    first = min(os.sched_getaffinity(0))
    assert shared["cores"] == [[first], [first]]
    assert alone["cores"] == [sorted(os.sched_getaffinity(0))] * 2
