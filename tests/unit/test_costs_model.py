"""The per-op roofline cost model and `ppsim costs`."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.cli.main import main
from ppsim.config.model import ARCH_FIELDS, model_fields
from ppsim.config.presets import HARDWARE_PRESETS
from ppsim.config.schema import hardware_config
from ppsim.costs.costfile import cost_document, write_costs
from ppsim.costs.layerops import attention_ops, head_ops, layer_ops
from ppsim.costs.ops import FLASH_BACKWARD, Op, Roofline, matmul_efficiency, op_times, piece_times
from ppsim.costs.transformer import (
    Accelerator,
    Architecture,
    accelerator,
    model_params,
    transformer_costs,
)

H200 = accelerator(hardware_config({"preset": "h200-141gb"}))


def arch(preset: str, **kw) -> Architecture:
    f = model_fields({"preset": preset, **kw})
    return Architecture(**{k: v for k, v in f.items() if k in ARCH_FIELDS})


@pytest.mark.parametrize("preset,total,active", [
    ("deepseek-v3", 671e9, 37e9), ("qwen3-235b-a22b", 235e9, 22e9),
    ("mixtral-8x7b", 46.7e9, 12.9e9), ("llama3.1-405b", 405e9, 405e9),
    ("llama3-8b", 8.03e9, 8.03e9)])
def test_parameter_counts_match_model_cards(preset, total, active):
    counts = model_params(arch(preset))
    t, a = counts.total, counts.active
    assert abs(t / total - 1) < 0.015 and abs(a / active - 1) < 0.025


# ------------------------------------------------------------------ the roofline


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.01, 1e4), st.floats(0.01, 1.0)), min_size=1,
                max_size=6, unique_by=lambda p: round(p[0], 3)),
       st.floats(1e-3, 1e5), st.floats(1e-3, 1e5))
def test_efficiency_curve_is_monotone_and_bounded(points, g1, g2):
    # A curve whose efficiency grows with size gives efficiencies in its range, growing.
    gs = sorted(p[0] for p in points)
    es = sorted(p[1] for p in points)
    r = Roofline(peak_tflops=100.0, matmul_efficiency=tuple(zip(gs, es, strict=True)))
    lo, hi = sorted((g1, g2))
    e_lo, e_hi = matmul_efficiency(r, lo), matmul_efficiency(r, hi)
    assert 0 < e_lo <= e_hi + 1e-12 <= es[-1] + 1e-9


def test_small_matmuls_pay_the_fixed_time():
    curve = HARDWARE_PRESETS["h200-141gb"]["matmul_efficiency"]
    r = Roofline(peak_tflops=989.0, matmul_efficiency=tuple(map(tuple, curve)))
    big = matmul_efficiency(r, 1100.0)
    assert abs(big * 989 - 790) < 15  # the measured 8192^3 rate
    assert matmul_efficiency(r, 1.0) < 0.3 * big


def test_memory_ops_are_bytes_over_bandwidth_with_a_kernel_floor():
    r = Roofline(peak_tflops=100.0, memory_bandwidth_gbps=1000.0, kernel_overhead_us=20.0)
    f, b, w, _, _ = op_times(r, Op("norm", nbytes=2e9))
    assert f == pytest.approx(2.0) and b == pytest.approx(4.0) and w == 0
    tiny = [Op(f"add{i}", nbytes=1.0) for i in range(10)]
    assert piece_times(r, tiny)[0] == pytest.approx(10 * 0.020)


def test_attention_is_causal_flash():
    a = arch("llama3-8b", tp=1)
    core = next(op for op in attention_ops(a) if op.attention)
    full = 2 * 2 * a.seq_length ** 2 * a.micro_batch_size * a.hidden_size  # QK^T and AV
    assert core.flops == pytest.approx(full / 2)
    # No recompute is FlashAttention too: the masked half is skipped all the same.
    none = next(op for op in attention_ops(arch("llama3-8b", tp=1, recompute="none"))
                if op.attention)
    assert none.flops == pytest.approx(full / 2)
    f, b, _, _, _ = op_times(H200.roofline(), core)
    assert b == pytest.approx(FLASH_BACKWARD * f)


def test_gqa_shrinks_only_the_kv_projection():
    mha = arch("llama3-8b", tp=1, num_kv_heads=32)
    gqa = arch("llama3-8b", tp=1)
    fl = {k: sum(op.flops for op in attention_ops(x) if not op.attention)
          for k, x in (("mha", mha), ("gqa", gqa))}
    s, h = gqa.seq_length, gqa.hidden_size
    assert fl["mha"] - fl["gqa"] == pytest.approx(2 * s * h * (2 * h - 2 * h // 4))


def test_without_roofline_figures_matmuls_use_the_flat_efficiency():
    # The cpu preset has no curve and no bandwidth: F is matmul + attention FLOPs.
    a = arch("tiny-gpt")
    acc = Accelerator(peak_tflops=1.0, efficiency=0.5)
    c = transformer_costs(a, acc)
    flops = sum(op.flops for op in layer_ops(a, "dense"))
    assert c.layers[0].forward_ms == pytest.approx(flops / 0.5e9)
    head_flops = sum(op.flops for op in head_ops(a))
    assert c.head.forward_ms == pytest.approx(head_flops / 0.5e9)


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_tp_divides_time_and_static(tp):
    one, many = (transformer_costs(arch("llama3-70b", tp=t), H200) for t in (1, tp))
    ratio = one.layers[0].static_bytes / many.layers[0].static_bytes
    assert tp * 0.99 < ratio <= tp  # norms stay whole on every rank
    fl1 = sum(op.flops for op in layer_ops(arch("llama3-70b", tp=1), "dense"))
    flt = sum(op.flops for op in layer_ops(arch("llama3-70b", tp=tp), "dense"))
    assert fl1 / flt == pytest.approx(tp, rel=1e-3)


def test_bad_efficiency_curve_is_one_line_exit_2(tmp_path, capsys):
    p = tmp_path / "c.toml"
    p.write_text('[model]\npreset = "gpt3-1.3b"\n[pipeline]\npp = 2\n'
                 '[hardware]\npreset = "h200-141gb"\nmatmul_efficiency = [[1, 2]]\n')
    assert main(["costs", "--config", str(p)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "hardware.matmul_efficiency" in err[0]


# ------------------------------------------------------------------ ppsim costs


def test_costs_json_lists_each_kind_once(capsys):
    # ep 1: the expert all-to-all is the job's (ppsim.job.layers), priced on its links.
    assert main(["costs", "--preset", "deepseek-v3", "--hardware", "h200-141gb", "--ep", "1",
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    a = replace(arch("deepseek-v3"), ep=1)
    c = transformer_costs(a, H200)
    kinds = {x["kind"]: x for x in doc["groups"]}
    assert set(kinds) == {"dense", "moe", "mtp"}
    assert sorted(i for x in doc["groups"] for i in x["layers"]) == list(range(c.num_layers))
    assert kinds["dense"]["layers"] == [0, 1, 2] and kinds["mtp"]["layers"] == [61]
    assert kinds["moe"]["forward_ms"] == pytest.approx(c.layers[3].forward_ms)
    assert doc["head"]["backward_ms"] == pytest.approx(c.head.backward_ms)
    assert set(doc["embedding"]) >= {"forward_ms", "backward_ms", "weight_grad_ms",
                                     "static_bytes", "activation_bytes", "output_bytes"}


def test_costs_reads_a_cost_file(tmp_path, capsys):
    fields = model_fields({"preset": "gpt3-1.3b", "tp": 1})
    measured = transformer_costs(arch("gpt3-1.3b", tp=1), Accelerator(peak_tflops=7.0))
    path = str(tmp_path / "costs.json")
    write_costs(path, cost_document(measured, source="profile", model=fields))
    assert main(["costs", "--preset", "gpt3-1.3b", "--tp", "1", "--costs", path,
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["source"].startswith("cost file")
    assert doc["layers"][0]["forward_ms"] == pytest.approx(measured.layers[0].forward_ms)
    assert doc["groups"][0]["layers"] == list(range(24))
    assert doc["head"]["activation_bytes"] == measured.head.activation_bytes
    assert main(["costs", "--preset", "gpt3-1.3b", "--tp", "1", "--costs", path]) == 0
    assert "head" in capsys.readouterr().out


# ------------------------------------------------------------------ profiling the device


def test_hardware_out_writes_a_usable_hardware_table(tmp_path, capsys):
    out = tmp_path / "hw.toml"
    assert main(["profile", "--hardware-out", str(out)]) == 0
    assert "written to" in capsys.readouterr().out
    cfg = tmp_path / "c.toml"
    cfg.write_text('[model]\npreset = "tiny-gpt"\n[pipeline]\npp = 2\n' + out.read_text())
    assert main(["costs", "--config", str(cfg), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["layers"][0]["forward_ms"] > 0
    hw = hardware_config(__import__("tomllib").loads(out.read_text())["hardware"])
    assert hw.memory_bandwidth_gbps > 0 and len(hw.matmul_efficiency) >= 4
    assert all(0 < e <= 1 for _, e in hw.matmul_efficiency)


def test_host_mediated_p2p_is_not_kept(monkeypatch, capsys, tmp_path):
    # One GPU: the two processes talk through the host. Stand in for that transport's
    # result (the gloo measurement itself is covered by test_profile).
    import ppsim.executor.measure as prof

    fake = {"latency_ms": 0.1, "bandwidth_gbps": 2.3, "backend": "gloo",
            "staged_via_host": True, "rounds": 1, "samples": []}
    monkeypatch.setattr(prof, "measure_p2p", lambda *a, **k: fake)
    doc = prof.profile(model_fields({"preset": "tiny-gpt"}), "cpu", repeats=1, warmup=0)
    assert doc["p2p"] is None
    assert doc["measurement"]["p2p_host_mediated"]["bandwidth_gbps"] == 2.3
    from ppsim.cli.profile_text import print_costs

    print_costs(doc, "t")
    assert "not an NVLink or InfiniBand" in " ".join(capsys.readouterr().out.split())
