"""FP8 under FSDP as torchtitan runs it (torchao's Float8Linear, ppsim.costs.fp8): the
decoder linears' GEMMs in FP8, no cached FP8 weight, the tensorwise recipe saving each
microbatch's FP8 weight transpose unless FSDP gathers the weights in FP8
(enable_fsdp_float8_all_gather, --fp8-param-gather), the rowwise recipe saving and
communicating bf16. Expected values are restated from the shapes."""

from __future__ import annotations

import json

import pytest

from ppsim.cli.main import main
from ppsim.config.schema import config_from_dict
from ppsim.errors import UserError
from ppsim.job import fsdp
from ppsim.job.collectives import all_gather_ms
from ppsim.job.model import build_job
from ppsim.job.traffic import tp_layer_ms
from ppsim.pipeline.problem import model_costs

H, KV, FFN = 4096, 1024, 14336  # llama3-8b at tp 1
LINEAR_PARAMS = H * (H + KV + KV + H) + 3 * H * FFN
"""One llama3-8b layer's linears: q, k, v, o and the gated MLP's three."""


def cfg(model: dict, pp: int = 2):
    return config_from_dict({"model": {"preset": "llama3-8b", "num_layers": 4, "tp": 1,
                                       "dp": 8, "fsdp": True, "recompute": "selective",
                                       **model},
                             "pipeline": {"pp": pp, "microbatches": 4},
                             "hardware": {"preset": "h100-80gb"}})


TENSORWISE = {"fp8": "hybrid", "fp8_recipe": "tensorwise"}
GATHER = {**TENSORWISE, "fp8_param_gather": True}
ROWWISE = {"fp8": "hybrid", "fp8_recipe": "rowwise"}


def test_the_linears_params_restate_the_preset() -> None:
    layer = model_costs(cfg({})).layers[0]
    norms = 2 * H
    assert layer.params == LINEAR_PARAMS + norms


@pytest.mark.parametrize("model, field", [
    ({"fp8": "hybrid"}, "model.fp8_recipe"),  # Megatron's default, delayed
    ({"fp8": "hybrid", "fp8_recipe": "blockwise"}, "model.fp8_recipe"),
    ({**ROWWISE, "fp8_param_gather": True}, "model.fp8_param_gather"),
])
def test_what_torchao_does_not_run_is_refused(model: dict, field: str) -> None:
    with pytest.raises(UserError) as err:
        cfg(model)
    assert err.value.field == field


def test_rowwise_is_torchaos_alone() -> None:
    with pytest.raises(UserError) as err:
        cfg({**ROWWISE, "fsdp": False, "distributed_optimizer": True})
    assert err.value.field == "model.fp8_recipe"


def test_torchao_caches_no_fp8_weight() -> None:
    """TE keeps an FP8 weight and its transpose all step (2 bytes a linear parameter);
    torchao casts the weight each forward."""
    bf16 = model_costs(cfg({})).layers[0].static_bytes
    assert model_costs(cfg(TENSORWISE)).layers[0].static_bytes == bf16
    te = model_costs(cfg({"fsdp": False, "distributed_optimizer": True}))
    te_fp8 = model_costs(cfg({**TENSORWISE, "fsdp": False, "distributed_optimizer": True}))
    assert te_fp8.layers[0].static_bytes - te.layers[0].static_bytes == 2 * LINEAR_PARAMS


def test_an_fp8_gather_holds_the_layers_weights_in_one_byte() -> None:
    """With pp FSDP holds each gathered weight all step: 1 byte a linear parameter gathered
    in FP8 (the norms' few in it too), the embedding's and the head's in bf16."""
    plain, gathered = model_costs(cfg(TENSORWISE)), model_costs(cfg(GATHER))
    layer = plain.layers[0]
    assert layer.static_bytes - gathered.layers[0].static_bytes == layer.params
    assert gathered.embedding.static_bytes == plain.embedding.static_bytes
    assert gathered.head.static_bytes == plain.head.static_bytes


def test_an_fp8_gather_moves_one_byte_a_parameter() -> None:
    job = build_job(cfg(GATHER))
    assert job is not None
    link = job.link("dp_shard")
    n = 1e9
    assert fsdp.gather_ms(job, n) == pytest.approx(all_gather_ms(n, link))
    assert fsdp.gather_ms(job, n, wide=n) == pytest.approx(all_gather_ms(2 * n, link))
    bf16 = build_job(cfg(TENSORWISE))
    assert bf16 is not None
    assert fsdp.gather_ms(bf16, n) == pytest.approx(all_gather_ms(2 * n, link))


def test_tensorwise_saves_each_microbatchs_fp8_weight() -> None:
    """The saved FP8 transpose of every linear weight, a microbatch's own; a view of the
    gathered FP8 weight under enable_fsdp_float8_all_gather; inside the backward alone
    when the layer is recomputed whole."""
    saved = model_costs(cfg(TENSORWISE)).layers[0].activation_bytes
    assert saved - model_costs(cfg(GATHER)).layers[0].activation_bytes == LINEAR_PARAMS
    full = [model_costs(cfg({**m, "recompute": "full"})).layers[0].activation_bytes
            for m in (TENSORWISE, GATHER, {})]
    assert full[0] == full[1] == full[2]


def test_rowwise_saves_and_sends_bf16() -> None:
    """torchao's rowwise recipe saves the bf16 input and weight (quantized again in the
    backward): the activations of a bf16 layer; the tensorwise one saves FP8 inputs."""
    bf16 = model_costs(cfg({})).layers[0].activation_bytes
    assert model_costs(cfg(ROWWISE)).layers[0].activation_bytes == bf16
    copies = model_costs(cfg(GATHER)).layers[0].activation_bytes
    assert copies < bf16


def _simulate(capsys: pytest.CaptureFixture[str], *extra: str) -> dict:
    args = ["simulate", "--preset", "llama3-8b", "--hardware", "h100-80gb", "--tp", "2",
            "--pp", "2", "--dp", "4", "--fsdp", "--microbatches", "8", "--json", *extra]
    assert main(args) == 0
    return json.loads(capsys.readouterr().out)


def test_fp8_under_fsdp_prices_faster_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    bf16 = _simulate(capsys)
    fp8 = _simulate(capsys, "--fp8-format", "hybrid", "--fp8-recipe", "tensorwise",
                    "--fp8-param-gather")
    assert fp8["iteration_time_ms"] < 0.9 * bf16["iteration_time_ms"]
    assert fp8["job"]["fp8"]["recipe"] == "tensorwise"


def test_the_refusal_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", "--preset", "llama3-8b", "--dp", "4", "--fsdp",
                 "--fp8-format", "hybrid"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "model.fp8_recipe" in err[0] and "--fp8-recipe rowwise" in err[0]


def test_rowwise_gathers_tensor_parallel_inputs_in_bf16() -> None:
    """torchtitan's Float8ColwiseParallel gathers the tensorwise recipe's quantized input;
    the rowwise recipe communicates in bf16."""
    def gathers(model: dict) -> float:
        job = build_job(cfg({"tp": 4, **model}))
        assert job is not None
        return tp_layer_ms(job, job.arch)[0].gathers_ms

    bf16 = gathers({})
    assert gathers(ROWWISE) == bf16
    assert gathers(TENSORWISE) < 0.6 * bf16  # half the bytes, the same latency


def test_the_torchtitan_job_names_its_float8(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "--preset", "llama3-8b", "--num-layers", "4", "--hardware", "h100-80gb",
            "--gpus", "16", "--global-batch-size", "32", "--fsdp", "--fp8-format", "e4m3",
            "--time-budget", "20", "--json"]
    assert main([*args, "--fp8-recipe", "rowwise"]) == 0
    titan = json.loads(capsys.readouterr().out)["best"]["torchtitan_job"]
    assert "Float8LinearConverter" in titan["quantization"]
    # The head stays in bf16 under the module name torchtitan gives it (decoder.py's
    # self.lm_head; llama3_405b's filter_fqns), the name the fqns export ends with.
    assert "filter_fqns=['lm_head']" in titan["quantization"]
    assert main([*args, "--fp8-recipe", "tensorwise"]) == 0
    titan = json.loads(capsys.readouterr().out)["best"]["torchtitan_job"]
    assert any("tensorwise" in n for n in titan["notes"])


def test_without_pp_the_units_in_flight_gather_in_fp8_too() -> None:
    """Without pp FSDP holds two units' gathered weights (the computing one and the
    prefetched one) and one unit's gradient: a decoder layer's weights in FP8 under the
    FP8 gather, when a layer is the largest unit."""
    def held(model: dict) -> int:
        c = model_costs(cfg({**model, "vocab_size": 1024}, pp=1))
        return c.embedding.static_bytes  # the units in flight ride on the embedding

    layer = LINEAR_PARAMS + 2 * H  # the largest unit at this vocabulary
    assert held(TENSORWISE) - held(GATHER) == 2 * layer  # two copies, 1 byte saved each
