"""Cost files (no torch): round trip, --costs changes simulate as the simulator predicts,
bad files exit 2 with one line, and calibration recovers known factors from a trace."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from ppsim.cli.main import main
from ppsim.config.schema import load_config
from ppsim.costs.costfile import cost_document, load_costs, read_cost_file, write_costs
from ppsim.costs.model import LayerCost, ModelCosts
from ppsim.pipeline.problem import Hardware, build_problem, model_costs
from ppsim.sim.simulate import simulate
from ppsim.trace.read import read_trace

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = load_config(None)
FIELDS = DEFAULT.model.fields()


def _write(path: Path, costs: ModelCosts, p2p: dict | None = None, **kw) -> str:
    write_costs(str(path), cost_document(costs, source="hand", model=FIELDS, p2p=p2p, **kw))
    return str(path)


def _scaled(costs: ModelCosts, f: float = 1.0, b: float = 1.0) -> ModelCosts:
    def one(c: LayerCost) -> LayerCost:
        return replace(c, forward_ms=c.forward_ms * f, backward_ms=c.backward_ms * b,
                       weight_grad_ms=c.weight_grad_ms * b)

    return ModelCosts(layers=tuple(one(c) for c in costs.layers), embedding=one(costs.embedding),
                      head=one(costs.head))


def _simulate_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["simulate", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_round_trip_uneven_layers(tmp_path: Path) -> None:
    layers = tuple(LayerCost(forward_ms=1.0 + i / 8, backward_ms=2.0 + i, weight_grad_ms=0.5,
                             static_bytes=1000 + i, activation_bytes=300, weight_grad_bytes=100,
                             output_bytes=64) for i in range(8))
    costs = ModelCosts(layers=layers, embedding=LayerCost(forward_ms=0.1, static_bytes=7),
                       head=LayerCost(forward_ms=0.7, backward_ms=1.4, weight_grad_ms=0.7))
    path = _write(tmp_path / "c.json", costs)
    assert load_costs(path) == costs
    assert load_costs(path, 8, FIELDS) == costs
    assert len(json.loads(Path(path).read_text())["layers"]) == 8


def test_uniform_file_has_one_entry_and_fits_any_depth(tmp_path: Path) -> None:
    costs = model_costs(DEFAULT)
    path = _write(tmp_path / "c.json", costs)
    assert len(json.loads(Path(path).read_text())["layers"]) == 1
    assert load_costs(path, 8) == costs
    assert load_costs(path, 12).num_layers == 12


def test_costs_change_simulate_as_the_simulator_predicts(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    base = model_costs(DEFAULT)
    same = _write(tmp_path / "same.json", base)
    slow_f = _write(tmp_path / "f2.json", _scaled(base, f=2.0))
    analytic = _simulate_json(capsys)["iteration_time_ms"]
    # No p2p in the file: the preset's link is kept, so the same costs give the same time.
    assert _simulate_json(capsys, "--costs", same)["iteration_time_ms"] == pytest.approx(analytic)
    got = _simulate_json(capsys, "--costs", slow_f)["iteration_time_ms"]
    expect = simulate(build_problem(DEFAULT, _scaled(base, f=2.0))).summary.iteration_time_ms
    assert got == pytest.approx(expect)
    assert got > analytic


def test_measured_p2p_beats_the_preset(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    base = model_costs(DEFAULT)
    path = _write(tmp_path / "c.json", base, p2p={"latency_ms": 3.0, "bandwidth_gbps": 0.5})
    got = _simulate_json(capsys, "--costs", path)["iteration_time_ms"]
    p = build_problem(DEFAULT, base)
    expect = simulate(replace(p, hardware=Hardware(p.hardware.memory_bytes, 3.0, 0.5)))
    assert got == pytest.approx(expect.summary.iteration_time_ms)
    # and through the config file's top-level key
    cfg = tmp_path / "cfg.toml"
    cfg.write_text(f'costs_file = "{path}"\n[model]\npreset = "tiny-llm"\n[pipeline]\npp = 2\n'
                   'split = [6, 2]\n[hardware]\npreset = "cpu"\n')
    assert _simulate_json(capsys, "--config", str(cfg))["iteration_time_ms"] == pytest.approx(got)


def _good() -> dict:
    return cost_document(model_costs(DEFAULT), source="hand", model=FIELDS,
                         p2p={"latency_ms": 0.1, "bandwidth_gbps": 1.0})


def _mutate(fn) -> str:
    doc = _good()
    fn(doc)
    return json.dumps(doc)


BAD = {
    "truncated": ("format", lambda: json.dumps(_good())[:200], "truncated"),
    "empty": ("empty", lambda: "", "not valid JSON"),
    "not-object": ("list", lambda: "[1, 2]", "expected a JSON object"),
    "format": ("format", lambda: _mutate(lambda d: d.update(format="other")), "format"),
    "version": ("version", lambda: _mutate(lambda d: d.update(version=9)), "version"),
    "no-layers": ("layers", lambda: _mutate(lambda d: d.pop("layers")), "layers"),
    "empty-layers": ("layers", lambda: _mutate(lambda d: d.update(layers=[])), "layers"),
    "negative": ("neg", lambda: _mutate(lambda d: d["layers"][0].update(forward_ms=-1)),
                 "layers[0].forward_ms"),
    "string": ("str", lambda: _mutate(lambda d: d["head"].update(backward_ms="1")),
               "head.backward_ms"),
    "unknown-key": ("key", lambda: _mutate(lambda d: d["embedding"].update(flops=1)),
                    "embedding.flops"),
    "w-exceeds-b": ("w", lambda: _mutate(lambda d: d["layers"][0].update(weight_grad_ms=1e9)),
                    "weight_grad_ms"),
    "fractional-bytes": ("b", lambda: _mutate(lambda d: d["layers"][0].update(
        static_bytes=1.5)), "static_bytes"),
    "p2p": ("p2p", lambda: _mutate(lambda d: d["p2p"].update(latency_ms=None)),
            "p2p.latency_ms"),
    "layer-count": ("count", lambda: _mutate(lambda d: d.update(layers=d["layers"] * 3)),
                    "has 3 entries but model.num_layers is 8"),
    "other-model": ("arch", lambda: _mutate(lambda d: d["model"].update(hidden_size=128)),
                    "model.hidden_size"),
    # a layer measured with every expert on the rank is not one of ep = 2's
    "other-ep": ("ep", lambda: _mutate(lambda d: d["model"].update(ep=2)),
                 "the file was measured with ep = 2 but the config has 1"),
    # ... nor a layer of the whole sequence one of a context-parallel rank's (ppsim
    # profile measures it at cp > 1)
    "other-cp": ("cp", lambda: _mutate(lambda d: d["model"].update(cp=2)),
                 "model.cp: the file was measured with cp = 2 but the config has 1"),
    # a MoE layer of other experts, or attention of another kind, is another layer
    "other-top-k": ("topk", lambda: _mutate(lambda d: d["model"].update(top_k=2)),
                    "model.top_k: the file was measured with top_k = 2 but the config has 0"),
    "other-expert-width": ("moe", lambda: _mutate(lambda d: d["model"].update(
        moe_ffn_hidden_size=128)), "model.moe_ffn_hidden_size"),
    "other-shared": ("shared", lambda: _mutate(lambda d: d["model"].update(
        shared_expert_ffn_hidden_size=64)), "model.shared_expert_ffn_hidden_size"),
    "other-layers": ("kinds", lambda: _mutate(lambda d: d["model"].update(
        layers="dense*4, moe*4")), "model.layers"),
    "other-attention": ("mla", lambda: _mutate(lambda d: d["model"].update(
        attention="mla", kv_lora_rank=32)), "model.attention"),
    "other-window": ("window", lambda: _mutate(lambda d: d["model"].update(
        attention_window=16)), "model.attention_window"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_cost_file_exits_2_with_one_line(case: str, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    _, make, needle = BAD[case]
    path = tmp_path / f"{case}.json"
    path.write_text(make())
    assert main(["simulate", "--costs", str(path)]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    lines = out.err.strip().splitlines()
    assert len(lines) == 1, out.err
    assert needle in lines[0] and lines[0].startswith("ppsim simulate: error: ")


def test_missing_file_through_the_real_entry_point(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "ppsim.cli", "plan", "--costs",
                        str(tmp_path / "nope.json")], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "nope.json" in r.stderr
    assert "Traceback" not in r.stderr


def test_cache_sees_a_rewritten_file(tmp_path: Path) -> None:
    base = model_costs(DEFAULT)
    path = _write(tmp_path / "c.json", base)
    assert read_cost_file(path).layers[0] == base.layers[0]
    path = _write(tmp_path / "c.json", _scaled(base, f=3.0))
    assert read_cost_file(path).layers[0].forward_ms == pytest.approx(
        3 * base.layers[0].forward_ms)


# ------------------------------------------------------------------ calibrate (no torch)


def test_calibrate_recovers_known_factors_from_a_simulated_trace(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A trace simulated with F x1.7, B x0.6 and a 0.4 ms link is fitted exactly."""
    base = model_costs(DEFAULT)
    truth = _write(tmp_path / "truth.json", _scaled(base, f=1.7, b=0.6),
                   p2p={"latency_ms": 0.4, "bandwidth_gbps": 1.0})
    trace = tmp_path / "sim.json"
    assert main(["simulate", "--costs", truth, "--trace", str(trace)]) == 0
    measured = read_trace(str(trace))
    capsys.readouterr()
    out = tmp_path / "cal.json"
    assert main(["calibrate", str(trace), "--out", str(out), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["factors"]["F"] == pytest.approx(1.7)
    assert res["factors"]["B"] == pytest.approx(0.6)
    assert res["factors"]["W"] is None
    assert res["p2p_delay_ms"] == pytest.approx(0.4 + base.hidden_bytes / 1e6)
    span = max(o.end_us for o in measured.ops) / 1e3
    assert res["measured_iteration_ms"] == pytest.approx(span)
    assert res["predicted_after_ms"] == pytest.approx(span)
    assert abs(res["error_after"]) < 1e-9 < abs(res["error_before"])
    # the written file reproduces it
    again = _simulate_json(capsys, "--costs", str(out))["iteration_time_ms"]
    assert again == pytest.approx(span)


def test_calibrate_takes_the_trace_after_a_flag_of_several_values(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--recompute-modules core_attn TRACE` gave TRACE to the module list, and argparse
    said "the following arguments are required: TRACE"."""
    trace = tmp_path / "sim.json"
    flags = ["--recompute-modules", "core_attn"]
    assert main(["simulate", *flags, "--trace", str(trace)]) == 0
    capsys.readouterr()
    runs = [["calibrate", str(trace), *flags], ["calibrate", *flags, str(trace)]]
    got = []
    for argv in runs:
        assert main([*argv, "--out", str(tmp_path / "c.json"), "--json"]) == 0
        got.append(json.loads(capsys.readouterr().out))
    assert got[0] == got[1] and got[0]["trace"] == str(trace)
    packed = tmp_path / "sim.json.gz"
    packed.write_bytes(gzip.compress(trace.read_bytes()))
    assert main(["calibrate", *flags, str(packed), "--out", str(tmp_path / "z.json"),
                 "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["trace"] == str(packed) and again["factors"] == got[0]["factors"]
    assert main(["calibrate", *flags]) == 2
    assert "error: TRACE: missing" in capsys.readouterr().err


def test_calibrate_scales_the_split_backward_path_with_its_weight_gradients(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """W measured 2.5x its profile on a split-backward schedule: the calibrated file keeps
    W inside the split backward it belongs to (a W scaled alone outgrew it: exit 2)."""
    def with_split(c: LayerCost, kw: float) -> LayerCost:
        w = 0.9 * c.backward_ms
        return replace(c, weight_grad_ms=w * kw, backward_ms=c.backward_ms - w + w * kw,
                       split_backward_ms=c.backward_ms - w + w * kw)

    base = model_costs(DEFAULT)

    def costs(kw: float) -> ModelCosts:
        return ModelCosts(layers=tuple(with_split(c, kw) for c in base.layers),
                          embedding=base.embedding, head=with_split(base.head, kw))

    profiled = _write(tmp_path / "profiled.json", costs(1.0))
    truth = _write(tmp_path / "truth.json", costs(2.5))
    trace = tmp_path / "sim.json"
    assert main(["simulate", "--schedule", "zb-h1", "--costs", truth, "--trace",
                 str(trace)]) == 0
    capsys.readouterr()
    out = tmp_path / "cal.json"
    assert main(["calibrate", str(trace), "--schedule", "zb-h1", "--costs", profiled,
                 "--out", str(out), "--json"]) == 0, capsys.readouterr().err
    res = json.loads(capsys.readouterr().out)
    assert res["factors"]["W"] == pytest.approx(2.5)
    assert abs(res["error_after"]) < 1e-9
    fitted = load_costs(str(out))
    for c in (*fitted.layers, fitted.head):
        assert c.weight_grad_ms <= c.split_backward_ms


def test_calibrate_rejects_a_trace_of_another_model(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "sim.json"
    assert main(["simulate", "--trace", str(trace)]) == 0
    capsys.readouterr()
    assert main(["calibrate", str(trace), "--num-layers", "12", "--out",
                 str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--config" in err[0]
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [')
    assert main(["calibrate", str(bad), "--out", str(tmp_path / "c.json")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_calibrate_tells_the_head_apart(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Layers x1.5 but head x3: the last stage's excess is put on the head, not the layers."""
    base = model_costs(DEFAULT)
    layers = _scaled(base, f=1.5, b=1.5)
    truth_costs = replace(layers, head=_scaled(base, f=3.0, b=3.0).head)
    truth = _write(tmp_path / "truth.json", truth_costs)
    trace = tmp_path / "sim.json"
    assert main(["simulate", "--costs", truth, "--trace", str(trace)]) == 0
    capsys.readouterr()
    out = tmp_path / "cal.json"
    assert main(["calibrate", str(trace), "--out", str(out), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["factors"]["F"] == pytest.approx(1.5)
    assert res["head_factors"]["F"] == pytest.approx(3.0)
    assert res["head_factors"]["B"] == pytest.approx(3.0)
    assert res["error_after"] == pytest.approx(0.0, abs=1e-9)
    assert load_costs(str(out), 8).head.forward_ms == pytest.approx(truth_costs.head.forward_ms)


def test_a_context_parallel_file_holds_for_its_traffic_alone(tmp_path: Path) -> None:
    """A layer measured with K and V gathered over cp 2 prices cp 2 with that traffic,
    not with the ring's; at cp 1 the traffic type is no part of the layer."""
    from ppsim.costs.costfile import check_model
    from ppsim.errors import UserError

    path = tmp_path / "cp.json"
    path.write_text(_mutate(lambda d: d["model"].update(cp=2, cp_comm_type="all_gather")))
    gathered = read_cost_file(str(path))
    check_model(gathered, {**FIELDS, "cp": 2, "cp_comm_type": "all_gather"})
    with pytest.raises(UserError, match="measured with cp_comm_type = 'all_gather' but the "
                       "config has 'p2p'"):
        check_model(gathered, {**FIELDS, "cp": 2})
    path.write_text(_mutate(lambda d: d["model"].update(cp_comm_type="all_gather")))
    assert main(["simulate", "--costs", str(path)]) == 0


def _calibrate_profiled(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                        conditions: dict) -> tuple[str, Path, dict]:
    """`ppsim calibrate --json` of a trace simulated from the default costs scaled (F 1.3,
    B 0.8, slower messages) on a profiled base file that holds `conditions`: (the base
    file, the cost file written, calibrate's JSON)."""
    base = model_costs(DEFAULT)
    profiled = _write(tmp_path / "profiled.json", base, conditions=conditions,
                      p2p={"latency_ms": 0.1, "bandwidth_gbps": 1.0})
    truth = _write(tmp_path / "truth.json", _scaled(base, f=1.3, b=0.8),
                   p2p={"latency_ms": 0.4, "bandwidth_gbps": 1.0})
    trace, out = tmp_path / "sim.json", tmp_path / "cal.json"
    assert main(["simulate", "--costs", truth, "--trace", str(trace)]) == 0
    capsys.readouterr()
    assert main(["calibrate", str(trace), "--costs", profiled, "--out", str(out),
                 "--json"]) == 0
    return profiled, out, json.loads(capsys.readouterr().out)


def test_the_calibrated_file_simulates_to_the_time_calibrate_predicts_from_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A profiled base file holds run conditions: calibrate's 'after' kept the iteration
    boundary it measured while the file it wrote dropped every condition, so simulate
    --costs OUT came out shorter than the time calibrate said the file predicts."""
    conditions = {"devices": [0, 1], "processes": 2, "cores": 2, "message_cpu_ms": 0.3,
                  "context_switch_ms": 0.01, "iteration_boundary_ms": 0.7,
                  "message_latency_ms": 0.5, "local_message_cpu_ms": 0.2,
                  "optimizer": {"fixed_ms": 0.2, "gbps": 2.0, "kind": "adam"}}
    _, out, res = _calibrate_profiled(tmp_path, capsys, conditions)
    after = res["predicted_after_ms"]
    assert _simulate_json(capsys, "--costs", str(out))["iteration_time_ms"] == \
        pytest.approx(after)
    kept = json.loads(out.read_text())["conditions"]  # measured, and not in the factors
    assert kept["iteration_boundary_ms"] == 0.7 and kept["optimizer"]["gbps"] == 2.0


def test_calibrate_fits_the_head_on_its_split_backward_path(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """On zb-h1 the last stage's B is predicted from the head's split path, but the head's
    own share was taken from its whole backward: where the profile measured the two apart
    the head's B factor came out many times too high."""
    def split(c: LayerCost, path: float) -> LayerCost:
        w = 0.4 * c.backward_ms
        return replace(c, weight_grad_ms=w, split_backward_ms=path * c.backward_ms)

    base = model_costs(DEFAULT)
    profiled = replace(base, head=split(base.head, 3.0))
    truth = replace(profiled, head=split(replace(base.head, backward_ms=2 * base.head.backward_ms),
                                         3.0))
    trace = tmp_path / "sim.json"
    assert main(["simulate", "--schedule", "zb-h1", "--costs",
                 _write(tmp_path / "truth.json", truth), "--trace", str(trace)]) == 0
    capsys.readouterr()
    assert main(["calibrate", str(trace), "--schedule", "zb-h1", "--costs",
                 _write(tmp_path / "profiled.json", profiled), "--out",
                 str(tmp_path / "cal.json"), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["head_factors"]["B"] == pytest.approx(2.0)
    assert abs(res["error_after"]) < 1e-9


def test_calibrate_before_is_the_time_the_base_file_simulates_to(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """calibrate's 'before' priced the trace's schedule with the base file's op times but
    without its shared cores and per-message CPU, so it read shorter than simulate --costs
    BASE (which keeps them): the error it printed was not the base file's."""
    conditions = {"devices": [0, 0], "processes": 2, "cores": 1, "message_cpu_ms": 0.3,
                  "context_switch_ms": 0.01, "local_message_cpu_ms": 0.2}
    profiled, _, res = _calibrate_profiled(tmp_path, capsys, conditions)
    before = res["predicted_before_ms"]
    assert _simulate_json(capsys, "--costs", profiled)["iteration_time_ms"] == \
        pytest.approx(before)
