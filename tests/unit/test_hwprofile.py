"""`ppsim profile --hardware-out` at a model's own kernels (executor/hwprofile.py)."""

from __future__ import annotations

import json
import tomllib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.cli.main import main
from ppsim.config.schema import hardware_config

pytest.importorskip("torch")

from ppsim.executor.hwprofile import (  # noqa: E402
    _curve_points,
    efficiency_curve,
    hardware_table,
)


def _passes(m: int, n: int, k: int) -> set[tuple[int, int, int]]:
    """Forward Y = X W (m x k by k x n), dX = dY W^T, dW = X^T dY."""
    return {(m, n, k), (m, k, n), (k, n, m)}


def test_a_models_own_matmuls_and_attention_are_measured(tmp_path, capsys):
    # tiny-gpt at tp 2 with dropout: 2 x 64 tokens, hidden 64, 4 heads of 16, MLP 256,
    # vocabulary 2048 (a multiple of 128 x 2 already).
    cfg = tmp_path / "c.toml"
    cfg.write_text('[model]\npreset = "tiny-gpt"\ntp = 2\ndropout = true\n')
    out = tmp_path / "hw.toml"
    assert main(["profile", "--hardware-out", str(out), "--config", str(cfg),
                 "--sustained", "0.05", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    m = doc["measurements"]
    tokens = 128
    want = (_passes(tokens, 3 * 64 // 2, 64) | _passes(tokens, 64, 64 // 2)
            | _passes(tokens, 256 // 2, 64) | _passes(tokens, 64, 256 // 2)
            | _passes(tokens, 2048 // 2, 64))
    assert {tuple(x["shape"]) for x in m["model_matmuls"]} == want
    att = m["model_attention"]
    assert (att["heads"], att["kv_heads"], att["head_dim"], att["seq_length"],
            att["micro_batch_size"], att["dropout"]) == (2, 2, 16, 64, 2, 0.1)
    # Causal attention's FLOPs: 4 s^2 b (heads x head_dim) per rank, half skipped.
    assert att["flops"] == pytest.approx(2 * 64 * 64 * 2 * 2 * 16)
    assert m["sustained_s"] == 0.05 and m["settled_tflops"] > 0 and m["window_ms"] == 50
    assert "timed over a 50 ms window" in out.read_text()
    table = tomllib.loads(out.read_text())["hardware"]
    hw = hardware_config(table)
    assert hw.attention_efficiency == pytest.approx(
        min(1.0, att["tflops"] / table["peak_tflops"]), abs=1e-4)
    gflops = [g for g, _ in hw.matmul_efficiency]
    assert gflops == sorted(set(gflops))
    model_work = {float(f"{2 * a * b * c / 1e9:.4g}") for a, b, c in want}  # 4 figures
    assert model_work <= set(gflops)
    assert f"At the model's own {len(want)} matmul shapes" in out.read_text()


def test_bad_warm_up_a_uniform_model_and_the_config_as_output_are_refused(tmp_path, capsys):
    out = tmp_path / "hw.toml"
    assert main(["profile", "--hardware-out", str(out), "--sustained", "-1"]) == 2
    assert "--sustained" in capsys.readouterr().err
    cfg = tmp_path / "u.toml"
    cfg.write_text('[model]\nkind = "uniform"\nnum_layers = 4\n')
    assert main(["profile", "--hardware-out", str(out), "--config", str(cfg)]) == 2
    assert "model.kind" in capsys.readouterr().err
    assert not out.exists()
    mine = tmp_path / "mine.toml"
    mine.write_text('[model]\npreset = "tiny-gpt"\n')
    assert main(["profile", "--hardware-out", str(mine), "--config", str(mine)]) == 2
    assert "is also --config" in capsys.readouterr().err
    assert mine.read_text() == '[model]\npreset = "tiny-gpt"\n'


_point = st.fixed_dictionaries({"gflop": st.sampled_from([0.5, 1.0, 2.0, 8.0, 64.0, 512.0]),
                                "tflops": st.floats(1.0, 1200.0)})


@settings(max_examples=200, deadline=None)
@given(generic=st.lists(_point, min_size=1, max_size=8),
       model=st.lists(_point, max_size=8))
def test_the_curve_has_one_point_per_work_the_model_s_inside_its_range(generic, model):
    peak = 989.0
    curve = efficiency_curve(_curve_points(generic, model), peak)
    gflops = [g for g, _ in curve]
    assert gflops == sorted(set(gflops))
    lo = min((x["gflop"] for x in model), default=None)
    hi = max((x["gflop"] for x in model), default=None)
    for g, e in curve:
        if model and lo <= g <= hi:
            source = [x for x in model if x["gflop"] == g]  # the model's alone inside
        else:
            source = [x for x in generic + model if x["gflop"] == g]
        effs = [min(1.0, x["tflops"] / peak) for x in source]
        assert source and min(effs) - 1e-4 <= e <= max(effs) + 1e-4


def test_a_kernel_is_timed_over_a_window_no_longer_than_the_warm_up():
    from ppsim.executor.hwprofile import window_ms

    assert (window_ms(8.0), window_ms(0.2), window_ms(0.05), window_ms(0.0)) == \
        (200.0, 200.0, 50.0, 0.0)


def test_progress_counts_every_step_once():
    from ppsim.executor.hwprofile import measure_hardware

    seen: list[tuple[str, int, int]] = []
    measure_hardware("cpu", reps=1, sustained_s=0.02,
                     progress=lambda what, done, total: seen.append((what, done, total)))
    totals = {t for _, _, t in seen}
    assert len(totals) == 1 and [d for _, d, _ in seen] == list(range(totals.pop()))
    assert seen[0][0].startswith("warming up") and "bandwidth" in seen[-1][0]


@given(st.floats(0.01, 5000.0), st.floats(0.001, 1.0), st.floats(0.001, 1.0))
def test_the_table_s_efficiencies_times_its_peak_give_back_the_measured_rates(
        peak, matmul_share, attention_share):
    # A slow CPU's peak is a few hundredths of a TFLOP/s: rounded to three decimals after
    # the efficiencies were taken of it, the table gave back rates up to 10 % off.
    matmul = {"shape": [64, 64, 64], "gflop": 2 * 64**3 / 1e9, "tflops": matmul_share * peak}
    table = hardware_table(peak, [matmul], attention_share * peak, 100.0, 10.0)
    [(_, eff)] = table["matmul_efficiency"]
    for got, rate in ((eff, matmul["tflops"]),
                      (table["attention_efficiency"], attention_share * peak)):
        assert got * table["peak_tflops"] == pytest.approx(rate, rel=1e-3, abs=1e-4 * peak)


@given(st.floats(0.01, 5000.0), st.floats(1e-9, 1.0), st.floats(1e-9, 1.0))
def test_a_table_of_any_positive_rates_is_one_the_config_accepts(peak, matmul_share,
                                                                 attention_share):
    # A loaded CPU timed a tiny matmul at ~1e-5 of its peak: rounded to 4 decimals that
    # was 0, a curve point `[hardware]` refuses (the flaky `costs` after --hardware-out).
    matmul = {"shape": [8, 8, 8], "gflop": 2 * 8**3 / 1e9, "tflops": matmul_share * peak}
    table = hardware_table(peak, [matmul], attention_share * peak, 100.0, 21194.67)
    hw = hardware_config(table)
    assert all(e > 0 for _, e in hw.matmul_efficiency) and hw.attention_efficiency > 0


@pytest.mark.parametrize("name, fp8", [("NVIDIA H100 80GB HBM3", 1979.0),
                                       ("NVIDIA H200", 1979.0),
                                       ("NVIDIA A100-SXM4-80GB", 0.0),
                                       ("Some Future GPU", 0.0)])
def test_a_gpus_fp8_peak_is_its_datasheets_or_none(monkeypatch, name: str, fp8: float) -> None:
    """--hardware-out writes fp8_peak_tflops for the GPUs whose FP8 peak it knows (the
    H100's 1979), so a measured table prices --fp8-format; none for an A100 (no FP8
    tensor cores) or a GPU it does not know."""
    import torch

    from ppsim.executor.devices import fp8_peak

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert fp8_peak(torch.device("cuda")) == fp8
    assert fp8_peak(torch.device("cpu")) == 0.0


@pytest.mark.parametrize("name, facts", [
    ("NVIDIA B200", {"fp8_peak_tflops": 4500.0, "fp4_peak_tflops": 9000.0, "mxfp8": True}),
    ("NVIDIA GB200", {"fp8_peak_tflops": 5000.0, "fp4_peak_tflops": 10000.0, "mxfp8": True}),
    ("NVIDIA H100 80GB HBM3", {"fp8_peak_tflops": 1979.0}),
    ("NVIDIA A100-SXM4-80GB", {}),
])
def test_a_blackwells_fp4_and_mx_tensor_cores_go_into_its_table(monkeypatch, name: str,
                                                                 facts: dict) -> None:
    """--hardware-out on a B200 or GB200 writes its dense FP4 peak and MX formats, so a
    measured table prices --fp4-format and --fp8-recipe mxfp8; a GB200 is not taken for
    the B200 its name contains (2500 TFLOP/s bf16, 2250 on a B200)."""
    import torch

    from ppsim.executor.devices import dense_peak, low_precision_facts

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert low_precision_facts(torch.device("cuda")) == facts
    assert low_precision_facts(torch.device("cpu")) == {}
    if "B200" in name:
        assert dense_peak(torch.device("cuda"), 1.0) == (2500.0 if "GB200" in name else 2250.0)
    # [hardware] reads the table back as written; a fact left out stays off (0, False).
    hw = hardware_config({"peak_tflops": 989.0, **facts})
    assert (hw.peak_tflops, hw.fp8_peak_tflops, hw.fp4_peak_tflops, hw.mxfp8) == (
        989.0, facts.get("fp8_peak_tflops", 0.0), facts.get("fp4_peak_tflops", 0.0),
        facts.get("mxfp8", False))


def test_a_gpus_own_memory_and_sms_go_into_its_table(monkeypatch) -> None:
    """--hardware-out on a GPU writes the memory and SM count it reports (torch reported
    132 SMs on the lent H200), so a measured table prices DeepEP's held SMs; the table
    is one [hardware] accepts. Nothing is said of a CPU."""
    import types

    import torch

    from ppsim.executor.devices import device_facts

    h200 = types.SimpleNamespace(total_memory=150109880320, multi_processor_count=132)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: h200)
    facts = device_facts(torch.device("cuda"))
    assert facts == {"memory_bytes": 150109880320.0, "sm_count": 132}
    table = hardware_table(989.0, [{"shape": [8, 8, 8], "gflop": 1e-6, "tflops": 1.0}],
                           300.0, 3000.0, 10.0) | facts
    assert hardware_config(table).sm_count == 132
    assert device_facts(torch.device("cpu")) == {}


def test_the_table_says_its_kernel_overhead_is_the_eager_executors() -> None:
    """A measured table's kernel_overhead_us is eager PyTorch's host time per op (96 us on
    the lent H200): the table says so beside it, so nobody prices a fused Megatron job
    with it unawares; the table still loads."""
    from ppsim.executor.hwprofile import hardware_toml

    hw = hardware_table(989.0, [{"shape": [8, 8, 8], "gflop": 1e-6, "tflops": 1.0}],
                        300.0, 3000.0, 96.0)
    text = hardware_toml({"device": "NVIDIA H200", "torch_version": "2.11", "hardware": hw,
                          "measurements": {}})
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("kernel_overhead_us"))
    assert "eager executor" in lines[at - 1] and lines[at - 1].startswith("#")
    assert hardware_config(tomllib.loads(text)["hardware"]).kernel_overhead_us == 96.0


@pytest.mark.parametrize("flag", [["--out", "costs.json"], ["--model", "m:build"],
                                  ["--no-p2p"]])
def test_a_cost_file_asked_for_beside_the_hardware_table_is_refused(tmp_path, capsys,
                                                                     monkeypatch, flag):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "hw.toml"
    assert main(["profile", "--hardware-out", str(out), *flag]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"ppsim profile: error: {flag[0]}: "), err
    assert not out.exists() and not (tmp_path / "costs.json").exists()
