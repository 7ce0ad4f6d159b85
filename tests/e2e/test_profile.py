"""`ppsim profile` and `ppsim calibrate` on real processes (torch, gloo), nothing mocked."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("torch")

from helpers import run_main  # noqa: E402
from launches import Pool  # noqa: E402

from ppsim.cli.main import main
from ppsim.config.model import parse_model
from ppsim.costs.costfile import load_costs, read_cost_file  # noqa: E402
from ppsim.costs.mixers import mixer_params
from ppsim.trace.read import read_trace  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


def ppsim(*args: str) -> subprocess.CompletedProcess:
    """`ppsim ARGS` in this process."""
    code, out, err = run_main(list(args))
    return subprocess.CompletedProcess(["ppsim", *args], code, out, err)


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory, launches: Pool) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("profile") / "costs.json"
    r = launches.cli("profile", "--out", str(out), "--repeats", "5", "--warmup", "1", "--json")
    assert r.returncode == 0, r.stderr
    return out, json.loads(r.stdout)


@pytest.fixture(scope="module")
def recorded(launches: Pool) -> Path:
    """The default config's run (2 iterations, 1 warm-up), pooled with other tests."""
    run = launches.get("default")
    return run.tmp / run.summary["trace"]


def test_profile_writes_a_loadable_file_with_positive_numbers(profiled) -> None:
    path, doc = profiled
    cf = read_cost_file(str(path))
    costs = load_costs(str(path), 8, doc["model"])
    assert costs.num_layers == 8 and len(doc["layers"]) == 1
    for piece in (costs.layers[0], costs.head):
        assert piece.forward_ms > 0 and piece.backward_ms > 0
        assert 0 < piece.weight_grad_ms < piece.backward_ms
        assert piece.static_bytes > 0 and piece.activation_bytes > 0
    assert costs.embedding.forward_ms > 0 and costs.embedding.static_bytes > 0
    # The boundary tensor: micro_batch_size x seq_length x hidden_size fp32 values.
    m = doc["model"]
    assert costs.layers[0].output_bytes == m["micro_batch_size"] * m["seq_length"] * \
        m["hidden_size"] * 4
    assert cf.p2p_latency_ms is not None and cf.p2p_latency_ms >= 0
    assert cf.p2p_bandwidth_gbps is not None and cf.p2p_bandwidth_gbps > 0
    assert len(doc["p2p"]["samples"]) >= 3 and doc["p2p"]["backend"] == "gloo"
    assert doc["device"] == "cpu" and doc["torch_version"]
    # Timed as the executor's ranks run: freed memory kept in the process (glibc).
    assert doc["measurement"]["freed_memory_kept"] is True


def test_profiled_bytes_match_what_the_executor_records(profiled, recorded) -> None:
    """Static bytes are the executor's exactly; activation peaks within one boundary tensor."""
    path, doc = profiled
    r = ppsim("simulate", "--costs", str(path), "--json")
    assert r.returncode == 0, r.stderr
    sim = json.loads(r.stdout)
    events = json.loads(recorded.read_text())["traceEvents"]
    hidden = doc["layers"][0]["output_bytes"]
    for rank in sim["ranks"]:
        mem = [e["args"] for e in events if e.get("ph") == "C" and e["pid"] == rank["rank"]]
        assert max(a["static"] for a in mem) == rank["static_bytes"]
        real_peak = max(a["static"] + a["activations"] for a in mem)
        assert abs(real_peak - rank["peak_memory_bytes"]) <= hidden


def test_calibrate_brings_the_prediction_closer(recorded, tmp_path: Path) -> None:
    # An A100 preset predicts the CPU run far too fast: calibration must pull it back.
    out = tmp_path / "cal.json"
    r = ppsim("calibrate", str(recorded), "--hardware", "a100-80gb", "--out", str(out),
              "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["iterations"] == [1]
    assert abs(res["error_after"]) < abs(res["error_before"])
    assert res["factors"]["F"] > 1 and res["factors"]["B"] > 1
    # The written file reproduces the calibrated prediction through --costs.
    r = ppsim("simulate", "--hardware", "a100-80gb", "--costs", str(out), "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)["iteration_time_ms"]
    assert got == pytest.approx(res["predicted_after_ms"])
    trace = read_trace(str(recorded))
    ops = [o for o in trace.ops if o.iteration == 1]
    measured = (max(o.end_us for o in ops) - min(o.start_us for o in ops)) / 1e3
    assert res["measured_iteration_ms"] == pytest.approx(measured)
    assert abs(got - measured) < abs(res["predicted_before_ms"] - measured)


def test_calibrate_on_top_of_a_profile(profiled, recorded, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = profiled
    out = tmp_path / "cal.json"
    assert main(["calibrate", str(recorded), "--costs", str(path), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "scale factors" in text and "predicted" in text
    doc = json.loads(out.read_text())
    assert doc["source"] == "calibrate" and doc["calibration"]["base"] == str(path)
    assert load_costs(str(out), 8).layers[0].forward_ms > 0


def test_profile_refuses_what_the_executor_cannot_run(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    cfg = tmp_path / "u.toml"
    cfg.write_text('[model]\nkind = "uniform"\nnum_layers = 4\nforward_ms = 1.0\n')
    assert main(["profile", "--config", str(cfg), "--out", str(tmp_path / "c.json")]) == 2
    assert "model.kind" in capsys.readouterr().err
    # Tensor parallelism is measured on CPU over gloo (test_executor_tp.py), not on a GPU.
    assert main(["profile", "--tp", "2", "--device", "cuda",
                 "--out", str(tmp_path / "c.json")]) == 2
    assert "--device" in capsys.readouterr().err
    # ... and so is expert parallelism (test_executor_ep.py)
    cfg.write_text('[model]\npreset = "tiny-gpt"\nnum_experts = 4\ntop_k = 2\n'
                   'moe_ffn_hidden_size = 96\nep = 2\n')
    assert main(["profile", "--config", str(cfg), "--dp", "2", "--device", "cuda",
                 "--out", str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--device: expert parallelism (ep = 2) is measured on CPU" in err[0]
    # context parallelism is measured in processes on CPU, the shipped decoders alone
    cfg.write_text('[model]\npreset = "tiny-hybrid"\ncp = 2\n')
    assert main(["profile", "--config", str(cfg), "--out", str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.cp: 2: the executor splits the sequence of the shipped" \
        in err[0], err
    # a device per rank, as simulate and run take them (three for two ranks was measured)
    assert main(["profile", "--devices", "0,1,2", "--out", str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "placement.devices: lists 3 devices for 2 ranks" in err[0], err
    assert not (tmp_path / "c.json").exists()


@pytest.mark.parametrize("via", ["config", "--model"])
def test_profile_measures_each_layer_kind_of_a_builder(via: str, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    """A heterogeneous stack (tests/model_moe.py: every third layer MoE) gets one
    measured cost per layer kind, each applied to every layer of that kind; named in the
    config or with --model, as ppsim run takes it (profile had no --model)."""
    spec = f"{ROOT}/tests/model_moe.py:build"
    cfg = tmp_path / "moe.toml"
    cfg.write_text('[model]\npreset = "tiny-gpt"\n'
                   + (f'builder = "{spec}"\n' if via == "config" else ""))
    out = tmp_path / "c.json"
    assert main(["profile", "--config", str(cfg), "--out", str(out), "--repeats", "2",
                 "--warmup", "0", "--no-p2p", "--json",
                 *(["--model", spec] if via == "--model" else [])]) == 0
    doc = json.loads(capsys.readouterr().out)
    layers = doc["layers"]
    moe = [i for i in range(8) if i % 3 == 1]
    assert len(layers) == 8 and doc["measurement"]["layers_sampled"]
    assert {i for i in doc["measurement"]["layers_sampled"]} & set(moe)
    for i in range(8):
        same = moe if i in moe else [j for j in range(8) if j not in moe]
        assert all(layers[j] == layers[i] for j in same)
    assert layers[1]["static_bytes"] > layers[0]["static_bytes"]  # experts and router
    assert all(x["forward_ms"] > 0 and x["activation_bytes"] > 0 for x in layers)


def test_a_bad_model_flag_is_refused_in_its_name(capsys: pytest.CaptureFixture[str]
                                                 ) -> None:
    assert main(["profile", "--model", "nosuch_module:build"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ppsim profile: error: --model: cannot import") and \
        err.count("\n") == 1, err


BROKEN_BUILDER = """
from ppsim.executor.builders.gpt import build as gpt


class _Broken:
    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def layer(self, i):
        raise ValueError("no such layer in this build")


def build(fields):
    return _Broken(gpt(fields))
"""


def test_a_builder_whose_pieces_fail_is_one_line_naming_it(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    (tmp_path / "broken.py").write_text(BROKEN_BUILDER)
    model = f"{tmp_path}/broken.py:build"
    assert main(["profile", "--preset", "tiny-gpt", "--model", model, "--out",
                 str(tmp_path / "c.json"), "--repeats", "1", "--warmup", "0", "--no-p2p"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if "note:" not in ln]
    assert err[-1].startswith(f"ppsim profile: error: --model: {model}"), err
    assert "ValueError: no such layer in this build" in err[-1]
    assert not any("Traceback" in ln for ln in err), err
    assert not (tmp_path / "c.json").exists()


def test_profile_measures_each_mixer_of_a_hybrid_pattern(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    """tiny-hybrid (M-*-G-E-): one measured cost per mixer kind, the four MLPs alike, and
    each kind holding the parameters the cost model counts."""
    out = tmp_path / "c.json"
    assert main(["profile", "--preset", "tiny-hybrid", "--out", str(out), "--repeats", "1",
                 "--warmup", "0", "--no-p2p", "--json"]) == 0
    layers = json.loads(capsys.readouterr().out)["layers"]
    arch = parse_model({"preset": "tiny-hybrid"}).arch  # type: ignore[union-attr]
    kinds = ["mamba", "mlp", "attention", "mlp", "gdn", "mlp", "moe-mlp", "mlp"]
    for layer, kind in zip(layers, kinds, strict=True):
        want = mixer_params(arch, kind)
        assert layer["params"] == want.dense + want.experts, kind
        assert layer["forward_ms"] > 0 and layer["activation_bytes"] > 0
    assert all(layers[i] == layers[1] for i in (3, 5, 7))
    assert main(["simulate", "--preset", "tiny-hybrid", "--costs", str(out), "--pp", "2",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["iteration_time_ms"] > 0
