"""Megatron's Muon (--optimizer muon, ppsim.costs.muon): a decoder weight keeps the fp32
master and one fp32 momentum (8 bytes, Adam's 12), the embedding and the output layer stay
on Adam, and the step runs --muon-num-ns-steps Newton-Schulz iterations on each whole
matrix. Expected values are restated from the shapes."""

from __future__ import annotations

import json

import pytest

from ppsim.cli.main import main
from ppsim.config.schema import config_from_dict
from ppsim.costs.muon import newton_schulz
from ppsim.costs.ops import Roofline
from ppsim.pipeline.problem import model_costs

H, KV, FFN = 4096, 1024, 14336  # llama3-8b at tp 1
MATRICES = H * (H + KV + KV + H) + 3 * H * FFN  # Muon's
LAYER = MATRICES + 2 * H  # and the two RMSNorms, on Adam


def _costs(**model):
    c = config_from_dict({"model": {"preset": "llama3-8b", "num_layers": 2, "tp": 1,
                                    **model},
                          "pipeline": {"pp": 1, "microbatches": 1},
                          "hardware": {"preset": "h100-80gb"}})
    return model_costs(c)


def test_a_layer_keeps_four_bytes_a_weight_less_and_the_edges_keep_adams() -> None:
    adam, muon = _costs(), _costs(optimizer="muon")
    assert adam.layers[0].params == LAYER
    assert adam.layers[0].static_bytes - muon.layers[0].static_bytes == 4 * MATRICES
    assert muon.head.static_bytes == adam.head.static_bytes
    assert muon.embedding.static_bytes == adam.embedding.static_bytes


def test_the_distributed_optimizer_spreads_the_momentum_too() -> None:
    adam = _costs(distributed_optimizer=True, dp=8)
    muon = _costs(distributed_optimizer=True, dp=8, optimizer="muon")
    assert adam.layers[0].static_bytes - muon.layers[0].static_bytes == pytest.approx(
        4 * MATRICES / 8, abs=1)


FLAT = Roofline(peak_tflops=100.0, efficiency=0.5)  # every matmul at 50 TFLOP/s


def _iteration_flops(rows: int, cols: int) -> float:
    m, n = min(rows, cols), max(rows, cols)
    return 2 * m * m * n + 2 * m * m * m + 2 * m * m * n  # X Xᵀ, A², B X


def test_newton_schulz_runs_five_iterations_on_each_whole_matrix() -> None:
    a = config_from_dict({"model": {"preset": "tiny-gpt"}}).model.arch
    h, f = 64, 256  # tiny-gpt: q, k, v, o of 64 x 64, fc1 256 x 64, fc2 64 x 256
    flops = 5 * (4 * _iteration_flops(h, h) + _iteration_flops(f, h) + _iteration_flops(h, f))
    ms_per_weight = flops / 50e9 / (4 * h * h + 2 * h * f)
    assert newton_schulz(a, FLAT).dense == pytest.approx(ms_per_weight, rel=1e-12)
    assert newton_schulz(a, FLAT).experts == 0.0


@pytest.mark.parametrize("steps", [1, 7])
def test_the_iteration_count_scales_the_step(steps: int) -> None:
    a = config_from_dict({"model": {"preset": "tiny-gpt", "muon_ns_steps": steps}}).model.arch
    five = config_from_dict({"model": {"preset": "tiny-gpt"}}).model.arch
    assert newton_schulz(a, FLAT).dense == pytest.approx(
        newton_schulz(five, FLAT).dense * steps / 5, rel=1e-12)


def test_tensor_parallel_modes() -> None:
    """duplicated: the whole matrix on every tensor rank; distributed: 1 / tp of it;
    blockwise: each rank's shard alone (smaller matrices, fewer FLOPs)."""
    def ns(mode: str) -> float:
        a = config_from_dict({"model": {"preset": "llama3-8b", "tp": 4,
                                        "muon_tp_mode": mode}}).model.arch
        return newton_schulz(a, FLAT).dense
    assert ns("duplicated") == pytest.approx(4 * ns("distributed"), rel=1e-12)
    assert ns("blockwise") < ns("distributed")


def _simulate(capsys, *extra: str) -> dict:
    assert main(["simulate", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--pp", "2",
                 "--gpus", "16", "--global-batch-size", "32", "--use-distributed-optimizer",
                 *extra, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_megatrons_flags_take_and_give_muon(capsys) -> None:
    adam, muon = _simulate(capsys), _simulate(capsys, "--optimizer", "muon")
    assert adam["job"]["optimizer"] == "adam" and muon["job"]["optimizer"] == "muon"
    assert all(m["peak_memory_bytes"] < a["peak_memory_bytes"]
               for a, m in zip(adam["ranks"], muon["ranks"], strict=True))
    dist = _simulate(capsys, "--optimizer", "dist_muon", "--muon-num-ns-steps", "7")
    assert dist["job"]["optimizer"] == "muon"
    assert dist["iteration_time_ms"] > muon["iteration_time_ms"]  # 7 iterations, not 5
    assert main(["presets", "llama3-8b", "--json"]) == 0
    assert "--optimizer" not in json.loads(capsys.readouterr().out)["megatron_model_args"]


def test_the_plan_line_names_muon(capsys) -> None:
    assert main(["plan", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--gpus", "16",
                 "--global-batch-size", "32", "--tp", "1", "--pp", "2",
                 "--use-distributed-optimizer", "--optimizer", "muon", "--muon-tp-mode",
                 "blockwise", "--top", "1", "--time-budget", "5", "--json"]) == 0
    line = json.loads(capsys.readouterr().out)["best"]["megatron_job_flags"]
    assert "--optimizer muon" in line and "--muon-tp-mode blockwise" in line


@pytest.mark.parametrize("argv, words", [
    (["simulate", "--preset", "llama3-8b", "--optimizer", "sgd"], "--optimizer"),
    (["simulate", "--preset", "llama3-8b", "--optimizer", "muon", "--fsdp", "--dp", "2"],
     "model.optimizer"),
    (["simulate", "--preset", "llama3-8b", "--muon-tp-mode", "rowwise"], "--muon-tp-mode"),
])
def test_what_is_not_priced_is_refused(capsys, argv: list[str], words: str) -> None:
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and words in err, err


@pytest.mark.parametrize("extra, words", [
    (["--dp", "2", "--use-distributed-optimizer"], "layer-wise distributed optimizer"),
    (["--engine", "torch"], "torch engine"),
])
def test_run_trains_muon_under_ddp_alone(tmp_path, capsys, extra: list[str],
                                         words: str) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[model]\npreset = "tiny-gpt"\noptimizer = "muon"\n')
    assert main(["run", "--config", str(cfg), *extra, "--print-launch"]) == 2
    err = capsys.readouterr().err
    assert "model.optimizer" in err and words in err and err.count("\n") == 1


def test_kimi_k2_under_muon_holds_4_bytes_a_routed_expert_weight_less(capsys) -> None:
    """Moonshot trained Kimi K2 with Muon: its Bridge H100 shape (tp 2, ep 32, etp 1 on
    512 GPUs) holds 4 bytes a routed expert weight less than under Adam, which the
    experts' one-rank data-parallel group (2 x 16 / (1 x 32)) never shards; the dense
    weights' difference, sharded over dp 16, adds under 2 %. A stage of 4 MoE layers
    holds 384 / 32 = 12 whole experts a layer, 3 x 7,168 x 2,048 weights each."""
    def static(*extra: str) -> float:
        assert main(["simulate", "--preset", "kimi-k2", "--hardware", "h100-80gb", "--pp",
                     "16", "--gpus", "512", "--global-batch-size", "4096",
                     "--use-distributed-optimizer", *extra, "--json"]) == 0
        return json.loads(capsys.readouterr().out)["ranks"][1]["static_bytes"]
    experts = 4 * 12 * 3 * 7168 * 2048
    saved = static("--optimizer", "adam") - static()  # the preset trains with Muon
    assert 4 * experts <= saved < 4 * experts * 1.02


def _muon_costs(tmp_path, kind: str) -> str:
    """tiny-gpt's analytic costs as a cost file whose step was timed with `kind`."""
    from ppsim.costs.costfile import cost_document

    cfg = config_from_dict({"model": {"preset": "tiny-gpt", "optimizer": "muon"}})
    doc = cost_document(model_costs(cfg), source="hand", model=None,
                        p2p={"latency_ms": 0.1, "bandwidth_gbps": 1.0})
    doc["conditions"] = {"devices": [0, 1], "optimizer": {"fixed_ms": 1.0, "gbps": 2.8,
                                                          "kind": kind}}
    path = tmp_path / f"{kind}.json"
    path.write_text(json.dumps(doc))
    return str(path)


def _problem(costs: str, optimizer: str):
    from ppsim.pipeline.problem import build_problem

    return build_problem(config_from_dict({"model": {"preset": "tiny-gpt",
                                                     "optimizer": optimizer},
                                           "costs_file": costs}))


def _steps(costs: str, optimizer: str) -> list[float]:
    from ppsim.sim.summary import step_parts

    p = _problem(costs, optimizer)
    hw = p.hardware
    return [s.optimizer_ms for s in step_parts(p.schedule, p.stage_costs, hw.p2p_latency_ms,
                                     hw.p2p_bandwidth_gbps, hw.memory_bandwidth_gbps, hw.dp,
                                     hw.optimizer_fixed_ms, hw.job)]


def test_a_step_timed_with_muon_prices_muons_step(tmp_path) -> None:
    """`ppsim profile` of a Muon model times the run's Muon step: its fixed time and rate
    price the step (28 bytes a weight at the fitted rate, as Adam's); a step timed with
    AdamW leaves Muon's to the roofline."""
    timed = _muon_costs(tmp_path, "muon")
    p = _problem(timed, "muon")
    params = [0] * p.schedule.pp
    for i, c in enumerate(p.stage_costs):
        params[p.schedule.stage_rank(i)] += c.params
    assert _steps(timed, "muon") == pytest.approx([1.0 + n * 28 / 2.8e6 for n in params],
                                                  rel=1e-12)
    assert _steps(_muon_costs(tmp_path, "adam"), "muon") != pytest.approx(
        _steps(timed, "muon"))


def test_an_unknown_timed_optimizer_is_refused(tmp_path, capsys) -> None:
    path = _muon_costs(tmp_path, "lion")
    assert main(["simulate", "--preset", "tiny-gpt", "--costs", path]) == 2
    err = capsys.readouterr().err
    assert "conditions.optimizer.kind" in err and err.count("\n") == 1
